"""The only package that runs Slurm binaries."""
