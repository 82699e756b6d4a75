"""Verifiers, judges and filters: rule checks, tool-call schema checks, step verification, outcome judges, dedup."""
