"""Benchmarks for trajforge (not part of the test suite)."""
