"""`from slurmkit.huggingface import AgreedStop`: the Hugging Face Trainer's agreed stop, a
TrainerCallback (slurmkit.worker.frameworks.huggingface; docs/frameworks.md). Imports transformers."""

from slurmkit.worker.frameworks.huggingface import AgreedStop

__all__ = ["AgreedStop"]
