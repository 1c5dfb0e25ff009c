"""Fault tolerance on the job's side: what happens after a rank fails or the job is told to stop.

- decision: the typed answer every policy function gives (an Action and its fields).
- policy: what comes next after the ranks' step failed, a rank raised (warm), or the health gate failed.
- restarts: the restart entries of run.json: recording them, their causes, the budget arithmetic.
- requeue: asking Slurm to requeue the job (and rank 0's reading of a stop signal).

The supervisor (slurmkit.worker.supervisor) calls the policy in its own process; rank 0 calls
requeue.after_stop after an agreed stop, and policy.restart_warm for a warm restart.
"""
