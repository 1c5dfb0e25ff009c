"""What the login side and the compute side share, and nothing else: formats both read and write,
and facts read from the Slurm environment. Torch-free; imports nothing from worker/, cli/ or the client's modules.

- atomic:     the one atomic write protocol (temp file, fsync, rename, fsync the folder)
- outcomes:   each rank's outcome record (JSON, never a pickle)
- metrics:    the metrics JSONL format, its writer and its readers
- slurm_env:  this job's id as submitit names files, and hostlist expansion without scontrol
- ports:      every port slurmkit picks for a job, from one table whose ranges never collide
- plan:       the supervisor's plan: how the job's ranks are launched (render writes, the supervisor reads)
- layout:     the run folder's layout (RunPaths): every path of one run
- locked:     a JSON file of one pydantic record (LockedJson), read and changed only under its file lock
- record:     run.json: its record (RunRecord, with the restart budget arithmetic) and its file (RunFile)
- markers:    the marker files one process leaves for another, each with its schema, writer and reader
- sweep_layout: a sweep folder's paths, its manifest (SweepManifest) and array log (ArrayList)
- perms:      folder and file modes of a run (private, or group), and the umask
- trust:      whether a file, folder, pickle or job id is the caller's own; the run's secret
"""
