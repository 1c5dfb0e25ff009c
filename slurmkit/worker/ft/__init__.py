"""The ranks' side of faults, for every kind of run:

- stop: the stop signals (their handlers only set a flag), the StopCoordinator, the one
  agreement on a stop and on a save's commit at a step boundary.
- watchdog: hang detection between step boundaries.
- checkpointable: a submitit Checkpointable's next call, run instead of the submitted one.

What rank 0 does once the ranks stopped is slurmkit.worker.interrupt's (`ended`); the Trainer's
own fault tolerance is slurmkit.worker.train's; every decision is the supervisor's
(slurmkit.supervisor).
"""
