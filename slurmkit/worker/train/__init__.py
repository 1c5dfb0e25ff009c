"""`task: train`: the Trainer (DDP, FSDP2) and its fault tolerance at step boundaries, its tasks
(digits, gpt), one incarnation's run (incarnation), the warm restart and fault injection."""
