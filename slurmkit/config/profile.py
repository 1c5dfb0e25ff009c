"""The cluster profile: where and how jobs run on one cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from slurmkit.config.container import Container
from slurmkit.config.fields import (
    SLURM_INT_MAX,
    SLURM_U16_MAX,
    EnvMap,
    Gres,
    HomePath,
    SbatchPath,
    SbatchValue,
    SlurmMem,
    SlurmTime,
    Strict,
    TildePath,
)
from slurmkit.config.login import LoginHost
from slurmkit.config.slurm_args import SbatchArgs, SbatchExtra, SrunArgs
from slurmkit.config.tracking import Tracking

SWEEP_MAX_TASKS = 1_000_000


class Resources(Strict):
    """What one job asks for. Every field may be left unset, and then the next layer decides."""

    nodes: int | None = Field(None, ge=1, le=SLURM_INT_MAX)
    """Number of nodes the ranks run on (sbatch --nodes, plus spare_nodes)."""
    spare_nodes: int | None = Field(None, ge=0, le=SLURM_INT_MAX)
    """Extra nodes allocated and kept idle (sbatch --nodes=nodes+spare_nodes --no-kill): when a node of
    the ranks fails, training starts again inside the job on a spare instead of a requeue."""
    elastic: bool | None = None
    """When a node of the ranks fails and no spare is left, go on inside the job on the nodes it still
    holds (sbatch --no-kill; a `task: train` run keeps its global batch, each rank taking a larger
    share) instead of a requeue (docs/fault-tolerance.md)."""
    tasks_per_node: int | None = Field(None, ge=1, le=SLURM_U16_MAX)
    """Ranks per node (sbatch --ntasks-per-node); usually one per GPU."""
    gpus_per_node: int | None = Field(None, ge=0, le=SLURM_U16_MAX)
    """GPUs per node (sbatch --gpus-per-node); 0 asks for none."""
    gpus_per_task: int | None = Field(None, ge=0, le=SLURM_U16_MAX)
    """GPUs per rank (sbatch --gpus-per-task), instead of gpus_per_node or a gpu gres."""
    gres: Gres | None = None
    """Generic resources per node as the cluster declares them, e.g. gpu:a100:4 or gpu:2,nvme:1 (sbatch --gres);
    a gpu item is the job's GPUs per node, instead of gpus_per_node or gpus_per_task."""
    cpus_per_task: int | None = Field(None, ge=1, le=SLURM_U16_MAX)
    """CPU cores per rank (sbatch --cpus-per-task)."""
    cpus_per_gpu: int | None = Field(None, ge=1, le=SLURM_U16_MAX)
    """CPU cores per allocated GPU (sbatch --cpus-per-gpu); Slurm takes it instead of cpus_per_task."""
    mem: SlurmMem | None = None
    """Memory per node, e.g. 8G, 8GB or 8000 (MB) (sbatch --mem, as 8G); unset leaves the partition default."""
    mem_per_gpu: SlurmMem | None = None
    """Memory per allocated GPU, e.g. 40G (sbatch --mem-per-gpu); Slurm takes it instead of mem."""
    time: SlurmTime | None = None
    """Wall-clock limit, e.g. 90 (minutes), 1:30:00 (unquoted is fine) or 2-00:00:00 (sbatch --time).
    0, UNLIMITED or INFINITE: no limit of the job's own (the partition's MaxTime still applies;
    the local executor runs without one)."""


DEFAULT_RESOURCES = Resources(nodes=1, spare_nodes=0, elastic=False, tasks_per_node=1, gpus_per_node=0, cpus_per_task=1,
                              time="00:30:00")


class RequeueBudget(Strict):
    """How many times a run is restarted per cause before it is left failed, and how many of the
    crash and hang restarts stay inside the allocation."""

    preemption: int = Field(20, ge=0)
    """Requeues after a preemption signal."""
    timeout: int = Field(5, ge=0)
    """Requeues after the time-limit signal."""
    node_failure: int = Field(3, ge=0)
    """Requeues after a NODE_FAIL or a failed health gate."""
    hang: int = Field(3, ge=0)
    """Requeues after the watchdog saw no step progress for hang_timeout."""
    crash: int = Field(3, ge=0)
    """Requeues after a rank died (killed, or an error not yet seen twice at the same step)."""
    in_job: int = Field(2, ge=0)
    """Of the crash and hang restarts, how many per job incarnation run again inside the allocation
    (a new srun step, no trip through the queue); each also spends its cause's budget. 0: every
    restart is a requeue."""
    no_progress_restarts: int = Field(3, ge=0)
    """The crash-loop breaker: a run whose last N restarts were each after a failure (crash, hang,
    node failure) and each came back to the same checkpointed step ends (why `no_progress`), even
    with budget left. 0 turns it off. Restarts after a preemption or the time limit never count."""
    standby: bool = True
    """Keep a standby set of rank processes in the allocation, their imports paid (torch,
    torch._dynamo), for the next in-job restart: a killed or hung rank restarts without fresh
    interpreters (slurmkit.worker.standby). They start once the ranks' first step is done, so they
    never slow the ranks' own start. It costs one more Python process per rank, idle after
    its imports (0.3 GB resident with torch on CPU), inside the job's memory: where the ranks use
    nearly all of it, turn this off. Used with in_job > 0, and not with spare nodes, elastic runs, containers, torchrun
    or Ray (their next step differs, or is not slurmkit's own srun of submitit's worker)."""


WINDOW_UNITS = {"m": 60, "h": 3600, "d": 86400}


class NodeLedgerPolicy(Strict):
    """What the memory of bad nodes does at submit (slurmkit.common.node_ledger; `slurmkit nodes`)."""

    exclude_after: int = Field(2, ge=0)
    """A node blamed this many times within `window` (a failed health gate, a lost node, a rank hung
    on it) is kept out of this user's next submits on the cluster; 0 turns the exclusion off."""
    window: str = Field("7d", pattern=r"^[1-9][0-9]{0,4}[mhd]$")
    """How far back blame counts: a number and m, h or d (7d)."""

    @property
    def window_s(self) -> float:
        return int(self.window[:-1]) * WINDOW_UNITS[self.window[-1]]


class StageData(Strict):
    """One file, folder or fsspec URI copied to every node's local disk before the ranks start."""

    model_config = ConfigDict(**Strict.model_config, populate_by_name=True)  # `from` in YAML, `source` in Python

    source: str = Field(alias="from", min_length=1)
    """A path every node can read (a file goes by sbcast; a folder is copied by each node) or an
    fsspec URI (s3://..., each node fetches it)."""
    to: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Its name under $SLURMKIT_STAGE on each node."""


class Stage(Strict):
    """What is copied to every node's local disk before anything of the job starts (docs/staging.md)."""

    env: bool = False
    """Pack the ranks' Python environment once (a zstd tar named by its content's hash), broadcast it
    with sbcast and unpack it on each node's local disk, where every later job and requeue on that
    node reuses it: the supervisor and every rank then import from the node, not the shared
    filesystem."""
    local_root: str | None = Field(None, pattern=r"^/[^\x00\n]*$")
    """An absolute folder on each node's local disk (made 0700, refused unless yours); unset:
    $SLURM_TMPDIR where the site sets it, else /tmp/slurmkit-UID/stage."""
    max_gb: int = Field(20, ge=1)
    """Unpacked copies on a node past this many GB are removed, least recently used first."""
    data: list[StageData] = Field(default_factory=list)
    """Data copied to every node's local disk for each job, as $SLURMKIT_STAGE/NAME (its time is
    `staging` in the goodput accounting)."""


class Setup(Strict):
    """Lines run in the batch shell before the ranks start."""

    modules: list[str] = Field(default_factory=list)
    """Environment modules to load with `module load` (each quoted)."""
    env: EnvMap = Field(default_factory=dict)
    """Environment variables exported in the batch script (values quoted)."""
    venv: HomePath | None = None
    """Path of a virtual environment to activate (`source VENV/bin/activate`)."""
    commands: list[str] = Field(default_factory=list)
    """Raw shell lines, run as written; the one place where the profile author writes shell."""


class ClusterProfile(Strict):
    """A cluster profile. Fields set here are overridden by the run spec and by --set."""

    extends: str | None = None
    """Name or path of a profile whose fields this one starts from."""
    description: str = ""
    """One line saying what cluster this profile targets."""
    executor: Literal["slurm", "local"] = "slurm"
    """slurm submits through sbatch; local runs the ranks as processes on this machine."""
    partition: SbatchValue | None = None
    """Slurm partition (sbatch --partition)."""
    account: SbatchValue | None = None
    """Slurm account to charge (sbatch --account)."""
    qos: SbatchValue | None = None
    """Quality of service (sbatch --qos)."""
    resources: Resources = Field(default_factory=lambda: Resources())
    """Default resources of every job on this cluster; the run spec overrides them field by field."""
    constraint: SbatchValue | None = None
    """Node features required (sbatch --constraint)."""
    exclude: SbatchValue | None = None
    """Nodes never to use (sbatch --exclude)."""
    reservation: SbatchValue | None = None
    """Reservation to run in (sbatch --reservation)."""
    signal: Literal["USR1", "USR2", "TERM", "INT", "HUP"] = "USR2"
    """Signal sent before the time limit or on preemption. USR2 by default: NCCL uses USR1."""
    signal_delay_s: int = Field(120, ge=0, le=65535)
    """Seconds before the limit at which the signal arrives (sbatch --signal=B:SIG@DELAY)."""
    node_ledger: NodeLedgerPolicy = Field(default_factory=lambda: NodeLedgerPolicy())
    """The memory of bad nodes across runs (docs/fault-tolerance.md, "Health")."""
    straggler_score: float = Field(0.7, ge=0, lt=1)
    """A rank whose own step work scores below this for three readings in a row (about 10 s apart)
    is named a straggler: in its run's log, `slurmkit status` and the node ledger. The score is the
    fastest rank's median over the rank's own (1.0: the fastest). 0 turns the scoring off."""
    straggler_action: Literal["warn", "replace"] = "warn"
    """What a straggler that lasts straggler_patience_s gets: warn names it only; replace replaces its
    node the way a lost one is: in the job where the job holds a spare node or is elastic (the ranks
    stop at an agreed step and save first), else it is left out at the run's next requeue."""
    straggler_patience_s: float = Field(300.0, ge=0)
    """Seconds a rank stays named a straggler before straggler_action: replace acts on it."""
    startup_timeout_s: float = Field(600.0, ge=0)
    """Seconds from a rank's start to its first completed step before it is a hang (cause
    startup_hang: its stack dumped, restarted as a hang is): a node that never joins the
    rendezvous, a hung NCCL init, a data loader stuck at start. It applies to the Trainer's task, a
    slurmkit.Checkpoint and the Lightning and Hugging Face callbacks, which report steps. 600 s is
    torch's own NCCL timeout; 0 turns it off."""
    requeue: RequeueBudget = Field(default_factory=lambda: RequeueBudget())
    """Requeue budget per cause."""
    stage: Stage = Field(default_factory=lambda: Stage())
    """Staging to the nodes' local disks (docs/staging.md): the Python environment, once per node."""
    setup: Setup = Field(default_factory=Setup)
    """Modules, environment variables, venv and raw lines run before the ranks start."""
    nccl_env: EnvMap = Field(default_factory=dict)
    """NCCL environment, e.g. NCCL_SOCKET_IFNAME, NCCL_IB_HCA; exported before launch."""
    health_gate: Literal["gpu", "always", "never"] = "gpu"
    """Node health gate before the ranks start (GPU count, uncorrectable ECC): gpu runs it for jobs that ask for
    GPUs, always for every job. A failing node is recorded and excluded when the job is requeued."""
    health_allreduce: bool = False
    """The health gate also runs a short all-reduce across the job's nodes (imports torch: a few seconds)."""
    container: Container | None = None
    """Container the ranks run in; unset runs on the host."""
    tracking: Tracking | None = None
    """Experiment trackers (MLflow, TensorBoard, W&B) every run of this profile logs to (docs/tracking.md)."""
    run_root: SbatchPath = "~/slurmkit-runs"
    """Folder that holds run folders; must be on a filesystem shared by login and compute nodes. Absolute,
    ~/... or $VAR/... (a variable must be set on the login node)."""
    run_mode: Literal["private", "group"] = "private"
    """Who may read a run folder: private makes it 0700 (files 0600), group 0750 with setgid (files 0640), so the
    folder's group can read logs and results. Nobody but the owner can ever write it."""
    checkpoint_root: str | None = None
    """fsspec URI for checkpoints (file://, s3://, ...); unset puts them in the run folder."""
    python: HomePath | None = None
    """Python interpreter on the compute nodes; unset uses the interpreter running slurmkit."""
    compile_cache: Literal["run", "node"] = "run"
    """Where a run's compiled code (config.compile: inductor's caches) is kept for its restarts: run is
    the run folder's compile-cache/ on the shared filesystem, read by every node and incarnation; node is
    each node's $TMPDIR (else /tmp) under slurmkit-UID/, private, fast, and lost with the node."""
    sbatch_extra: SbatchExtra = Field(default_factory=list)
    """More sbatch options as a list, each as --key=value or --flag (the older form of sbatch_args)."""
    sbatch_args: SbatchArgs = Field(default_factory=dict)
    """sbatch options slurmkit has no field for, as a mapping (submitit's slurm_additional_parameters):
    {mail-type: END, comment: nightly, exclusive: true}; mail_type is read as mail-type. An option slurmkit
    sets itself or has a field for (output, array, signal, requeue, ntasks-per-node, time, ...) is refused,
    naming that field. A run spec's sbatch_args replace these option by option."""
    srun_args: SrunArgs = Field(default_factory=list)
    """srun options appended to the ranks' step, and to the standby ranks' (submitit's slurm_srun_args):
    [--cpu-bind=cores, --mpi=pmix]. An option slurmkit sets itself (output, ntasks, kill-on-bad-exit, ...)
    is refused, naming its field. A run spec's srun_args come after these."""
    snapshot: bool = False
    """Copy the code at submit time into the run folder (code/) and run every incarnation from that copy: the
    git-tracked and untracked-but-not-ignored files of the current repository as they are on disk, or outside
    git the folder of the callable's module. So a requeue runs what was submitted, not what was edited since."""
    snapshot_max_mb: int = Field(100, ge=1)
    """The largest snapshot allowed, in MB; a larger one is refused at submit, naming its largest files."""
    sweep_max_tasks: int = Field(SWEEP_MAX_TASKS, ge=1)
    """The most tasks one sweep may make; a larger grid x list x random is refused at submit, counted before a
    task is made, so a typo of a few zeros cannot exhaust the login node's memory."""
    login: LoginHost | None = None
    """The login host, when slurmkit runs elsewhere (a laptop): every command then runs there over one SSH
    connection (docs/remote.md)."""
    template_dir: TildePath | None = None
    """Folder whose templates override the shipped ones, file by file or block by block."""
