"""Benchmarks users run on their cluster: all-reduce bandwidth (allreduce) and checkpoint-style
filesystem speed against dd on the same path (fs)."""
