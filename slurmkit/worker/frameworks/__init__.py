"""What the frameworks users already run need to get slurmkit's agreed stop: Lightning (lightning.py,
loaded by Lightning itself through its external-callback entry points) and the Hugging Face Trainer
(huggingface.py, one callback the script adds)."""
