"""What the login side and the compute side share, and nothing else: formats both read and write,
and facts read from the Slurm environment. Torch-free; imports nothing from worker/, cli/ or the client's modules.

- atomic:     the one atomic write protocol (temp file, fsync, rename, fsync the folder)
- outcomes:   each rank's outcome record (JSON, never a pickle)
- metrics:    the metrics JSONL format, its writer and its readers
- slurm_env:  this job's id as submitit names files, and hostlist expansion without scontrol
- ports:      every port slurmkit picks for a job, from one table whose ranges never collide
- plan:       the supervisor's plan: how the job's ranks are launched (render writes, the supervisor reads)
- layout:     the run folder's layout (RunPaths): every path of one run
- record:     run.json (RunRecord) and other JSON records, changed only under their file lock
- errors:     the one root error class (a one-line message, where, what is valid, an exit code)
- perms:      folder and file modes of a run (private, or group), and the umask
- trust:      whether a file, folder, pickle or job id is the caller's own; the run's secret
"""
