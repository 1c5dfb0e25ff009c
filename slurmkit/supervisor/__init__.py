"""The batch host's side of a job, torch-free: the one decider of every restart.

- loop: the supervisor, `python -P -m slurmkit.supervisor` (the batch script's last line): it starts
  the ranks' srun step, passes Slurm's signal on, and asks the policy after every step.
- policy: pure `decide(state, event) -> Decision`: what comes next after the ranks' step failed or
  stopped on a signal, a rank raised (warm), or the health gate failed. No I/O.
- decision: its typed answer (an Action, its fields, the effects it asks for).
- effects: the decider's eyes and hands: read the state, gather the event, carry out the effects
  (run.json, the requeue marker, scontrol requeue).
- restarts: the restart entries of run.json a start records: their causes, what they cost.
- allocation: the job's nodes, held and spare, as the policy sees them.
- local_requeue: the local profile's stand-in for a requeue (no Slurm, no supervisor process).
- signal_inbox: signals turned into flags and a wakeup fd (handlers only set flags).

It imports nothing of slurmkit.worker (tests/unit/test_house_rules.py). The ranks import it in the
places where rank 0 stands in for the supervisor's process, which is not there to ask: a warm
restart inside the ranks' processes, the local profile's requeue, the restart entry each start
records, and the signal inbox a command's runner shares.
"""
