"""slurmkit: Slurm-native job orchestration for PyTorch training."""

__version__ = "0.1.0"
