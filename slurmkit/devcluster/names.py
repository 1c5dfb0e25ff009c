"""Names, addresses, paths and config files of the dev cluster."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

STATE_DIR = Path(os.environ.get("SLURMKIT_DEVCLUSTER_STATE", "/var/lib/slurmkit-devcluster"))
NODE_LOCAL = Path("/local")
"""Each node's private local disk (a folder of STATE_DIR bound here in the node's own mount
namespace); the login side sees the host's own /local. The profile devcluster stages there."""
RUN_DIR = Path("/run/slurmkit-devcluster")
LOG_DIR = Path("/var/log/slurmkit-devcluster")
SLURM_CONF = Path("/etc/slurm/slurm.conf")
SLURMDBD_CONF = Path("/etc/slurm/slurmdbd.conf")
HOSTS_FILE = Path("/etc/hosts")
HOSTS_BEGIN = "# BEGIN slurmkit devcluster"
HOSTS_END = "# END slurmkit devcluster"
BRIDGE = "skbr0"
SUBNET = "10.77.0"
CONTROLLER_IP = f"{SUBNET}.1"
PARTITION = "debug"
# Real preemption, as shared clusters do it: a job in `urgent` (higher PriorityTier) takes the
# nodes of `debug` jobs, which Slurm signals, gives GRACE_TIME_S, then requeues. `scavenger`
# holds the same nodes with PreemptMode=CANCEL: preempted jobs there do not come back by themselves.
URGENT_PARTITION = "urgent"
CANCEL_PARTITION = "scavenger"
GRACE_TIME_S = 20
PARTITION_MAX_TIME_MIN = 60
MAX_ARRAY_SIZE = 1001  # Slurm's defaults; `devcluster up --max-array-size/--max-job-count` raise them
MAX_JOB_COUNT = 10000
DB_NAME = "slurmkit_acct_db"
DB_USER = "slurm"
DB_PASS = "slurmkit-dev"
NODE_CPUS = 2
NODE_MEM_MB = 8000


@dataclass(frozen=True)
class Node:
    index: int

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def ip(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def netns(self) -> str:
        return f"sk-{self.name}"

    @property
    def veth(self) -> str:
        return f"skv{self.index}"


def nodes(n: int) -> list[Node]:
    return [Node(i) for i in range(1, n + 1)]


CONF_HEADER = "# Written by `slurmkit devcluster up`; changes are overwritten."
CLUSTER_NAME = "slurmkit"


def controller_host() -> str:
    return socket.gethostname().split(".")[0]


MIN_JOB_AGE_S = 300  # Slurm's default: squeue shows a finished job this long


GRES_CONF = Path("/etc/slurm/gres.conf")
GPU_DEVICES = STATE_DIR / "dev"
"""Stand-in device files for the declared GPUs: slurmd binds a job to them (CUDA_VISIBLE_DEVICES)."""


def gres_conf(n: int, gpus_per_node: int) -> str:
    files = f"nvidia[0-{gpus_per_node - 1}]" if gpus_per_node > 1 else "nvidia0"
    return f"{CONF_HEADER}\nNodeName=node[1-{n}] Name=gpu File={GPU_DEVICES}/{files}\n"


@dataclass(frozen=True)
class Variant:
    """How a `devcluster up` differs from the default cluster, as real clusters differ (docs/devcluster.md)."""

    max_array_size: int = MAX_ARRAY_SIZE
    max_job_count: int = MAX_JOB_COUNT
    accounting: bool = True
    """False: no slurmdbd, AccountingStorageType=accounting_storage/none."""
    min_job_age_s: int = MIN_JOB_AGE_S
    gpus_per_node: int = 0
    """GPUs declared per node as GRES (gres_conf has their stand-in device files)."""
    preempt_user_signal: bool = False
    """Preemption sends the job's --signal first (22.05's SlurmctldParameters=preempt_send_user_signal)."""


DEFAULT = Variant()


def _node_lines(n: int, v: Variant) -> str:
    gres = f" Gres=gpu:{v.gpus_per_node}" if v.gpus_per_node else ""
    lines = "\n".join(f"NodeName={nd.name} NodeAddr={nd.ip} NodeHostname={nd.name} CPUs={NODE_CPUS} "
                      f"RealMemory={NODE_MEM_MB}{gres} State=UNKNOWN" for nd in nodes(n))
    return f"GresTypes=gpu\n{lines}" if v.gpus_per_node else lines


def _partition_lines(n: int) -> str:
    """The same nodes three times: the default (requeued on preemption), one cancelled on
    preemption, and the urgent one that preempts both."""
    nodes_, limit = f"Nodes=node[1-{n}]", f"MaxTime={PARTITION_MAX_TIME_MIN} State=UP"
    common = f"{nodes_} {limit}"
    return "\n".join([
        f"PartitionName={PARTITION} {nodes_} Default=YES {limit} PriorityTier=1 PreemptMode=REQUEUE "
        f"GraceTime={GRACE_TIME_S}",
        f"PartitionName={CANCEL_PARTITION} {common} PriorityTier=1 PreemptMode=CANCEL GraceTime={GRACE_TIME_S}",
        f"PartitionName={URGENT_PARTITION} {common} PriorityTier=10 PreemptMode=OFF",
    ])


TIMEOUT_LINES = """KillWait=5
# A node's message to a controller that is briefly frozen waits this long for the answer before it
# fails; a failed step-completion message is sent again only a minute later (slurmstepd), holding
# a requeued job back that long. Slurm's default is 10 s.
MessageTimeout=20
# A step whose completion message met a frozen or restarting controller sends it again a minute
# later; Slurm's default 60 s for a step to end would drain both nodes first ("Kill task failed",
# seen in CI), failing every cluster test after it.
UnkillableStepTimeout=180
"""


def slurm_conf(n: int, v: Variant = DEFAULT) -> str:
    accounting_lines = (f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost={CONTROLLER_IP}"
                        if v.accounting else "AccountingStorageType=accounting_storage/none")
    return f"""{CONF_HEADER}
ClusterName={CLUSTER_NAME}
SlurmctldHost={controller_host()}({CONTROLLER_IP})
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
# A requeued job waits cred_expire+1 s before it may start again: 5 is the least Slurm accepts.
AuthInfo=cred_expire=5
StateSaveLocation={STATE_DIR}/ctld
SlurmdSpoolDir={STATE_DIR}/slurmd-%n
SlurmctldPidFile={RUN_DIR}/slurmctld.pid
SlurmdPidFile={RUN_DIR}/slurmd-%n.pid
SlurmctldLogFile={LOG_DIR}/slurmctld.log
SlurmdLogFile={LOG_DIR}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
# A requeued job becomes eligible with no event to wake the scheduler: a 2 s cycle picks it up sooner.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=2
{"SlurmctldParameters=preempt_send_user_signal" if v.preempt_user_signal else "# preemption: SIGTERM, no user signal"}
{TIMEOUT_LINES}MinJobAge={v.min_job_age_s}
MaxArraySize={v.max_array_size}
MaxJobCount={v.max_job_count}
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
{accounting_lines}
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{_node_lines(n, v)}
{_partition_lines(n)}
"""


def slurmdbd_conf() -> str:
    return f"""# Written by `slurmkit devcluster up`.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser={DB_USER}
StoragePass={DB_PASS}
StorageLoc={DB_NAME}
PidFile={RUN_DIR}/slurmdbd.pid
LogFile={LOG_DIR}/slurmdbd.log
"""


def hosts_block(n: int) -> str:
    lines = [HOSTS_BEGIN, f"{CONTROLLER_IP} {controller_host()}-ctl"]
    lines += [f"{nd.ip} {nd.name}" for nd in nodes(n)]
    return "\n".join([*lines, HOSTS_END]) + "\n"
