"""Prefect flows and deployments that chain the stages, and the `trajforge` CLI."""
