"""Compute-node side: runs inside the job, imports torch freely (but lazily from entry)."""
