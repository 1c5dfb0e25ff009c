"""Fault tolerance on the job's side: what happens after a rank fails or the job is told to stop.

The supervisor's side (torch-free):
- policy: pure `decide(state, event) -> Decision`: what comes next after the ranks' step failed or
  stopped on a signal, a rank raised (warm), or the health gate failed. No I/O.
- decision: its typed answer (an Action, its fields, the effects it asks for).
- effects: the decider's eyes and hands: read the state, gather the event, carry out the effects
  (run.json, the requeue marker, scontrol requeue).
- restarts: the restart entries of run.json a start records: their causes, what they cost.
- allocation: the job's nodes, held and spare, as the policy sees them.

The ranks' side:
- stop: the stop signals (their handlers only set a flag), the StopCoordinator, the one
  agreement on a stop and on a save's commit at a step boundary, and the stop's typed record.
- trainer_ft: the Trainer's fault tolerance at its step boundaries (checkpointer, stop, watchdog,
  the live state a warm restart resumes from).
- incarnation: one incarnation of `task: train` (resume, record the restart, warm restarts, the stop).
- warm: restarting in the process after an exception; standby: rank processes kept ready for an
  in-job restart; watchdog: hang detection; interrupt: the stop for runs without step boundaries;
  faults: fault injection on purpose (config.faults).

The one Checkpointer the Trainer and slurmkit.Checkpoint share is slurmkit.worker.checkpoint's.

The supervisor (slurmkit.worker.supervisor) decides in its own process after every step: after a
stop (rank 0's record, common.markers.Stopped) and after a failure. Rank 0 asks the same decide only
for a warm restart inside the ranks' processes (a RankRaised event), which no other process can
carry out.
"""
