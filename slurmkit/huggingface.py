"""`from slurmkit.huggingface import AgreedStopCallback`: the Hugging Face Trainer's agreed stop, a
TrainerCallback (slurmkit.worker.frameworks.huggingface; docs/frameworks.md). Imports transformers."""

from slurmkit.worker.frameworks.huggingface import AgreedStopCallback

__all__ = ["AgreedStopCallback"]
