"""The Python API over the library: Executor (submit, map_array), sweep, and the handles Job and
SweepHandle."""
