"""Benchmarks users run on their cluster: all-reduce bandwidth (and, later, filesystem speed)."""
