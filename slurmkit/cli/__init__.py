"""The Typer CLI: thin command modules that parse, call the library and print.

The one place where slurmkit imports its own light modules inside functions: each command imports
the library it calls in its body, so `slurmkit --help` and every command pay only for what they use.
Measured on the dev machine: importing the app takes 0.11 s so; with every import at the top it
took 0.6 s (the pydantic models of every config, fsspec, the sweep store), on every call.
Elsewhere only the heavy modules (torch, matplotlib, submitit, ray, rich, tenacity, and the
modules that import them) are imported inside functions.
"""
