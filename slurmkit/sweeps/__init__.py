"""Config sweeps through Slurm job arrays."""
