"""What Slurm prints, read without a cluster: slurm/parse.py on output recorded from the dev
cluster's Slurm 22.05.8 (tests/data/slurm-22.05/, recorded with the exact argv of slurm/commands.py),
plus lines written by hand in the same formats for cases this cluster did not produce (a
heterogeneous job, NODE_FAIL then a rerun, unlimited and day-long time left). No 23.x output is
recorded here."""

from __future__ import annotations

import pytest

from slurmkit.common.slurm_env import base_id
from slurmkit.slurm import parse
from slurmkit.supervisor.policy import cause_of_signal
from slurmkit.supervisor.restarts import cause_of_previous
from tests.conftest import ROOT

RECORDED = ROOT / "tests" / "data" / "slurm-22.05"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def test_squeue_with_expanded_array_tasks() -> None:
    jobs = parse.squeue(recorded("squeue-array.txt"))
    assert jobs["111_0"].state == "PENDING" and jobs["111_0"].reason == "JobHeldUser"
    assert jobs["115"].state == "PENDING" and jobs["115"].reason == "BeginTime"  # requeued, waiting to start again
    assert jobs["113"].state == "FAILED" and jobs["113"].reason == "NonZeroExitCode"
    assert jobs["92"].nodes == "node[1-2]" and jobs["92"].elapsed == "0:28"
    assert not jobs["112"].active and jobs["111_2"].active


def test_squeue_pending_array_range_stands_for_every_task() -> None:
    jobs = parse.squeue(recorded("squeue-noarray.txt"))  # held: 111_[0-999%4] on one line
    tasks = [j for j in jobs if j.startswith("111_")]
    assert len(tasks) == 1000 and {jobs[t].state for t in tasks} == {"PENDING"}
    assert "111_999" in jobs and "111_1000" not in jobs
    assert parse.squeue("7_[3,5-6]|PENDING|Priority||0:00|7\n").keys() == {"7_3", "7_5", "7_6"}


def test_a_stepped_pending_array_stands_for_every_task_and_a_cut_list_is_never_guessed() -> None:
    """squeue prints `--array=2-18:2%9` stepped, and cuts a long list with `...` (Slurm's own test cases)."""
    stepped = parse.squeue("123_[2-18:2%9]|PENDING|JobArrayTaskLimit||0:00|123\n")
    assert sorted(stepped, key=lambda j: int(j.split("_")[1])) == [f"123_{i}" for i in range(2, 19, 2)]
    with pytest.raises(parse.TruncatedArray):
        parse.squeue("123_[2,4,6,...%9]|PENDING|Priority||0:00|123\n")


def test_sacct_incarnations_states_and_unknown_times() -> None:
    jobs = parse.sacct(recorded("sacct.txt"))
    assert jobs["114"].state == "CANCELLED"  # "CANCELLED by 0"
    assert jobs["113"].state == "FAILED" and jobs["113"].exit_code == "3:0"
    requeued = jobs["115"]
    assert [i.state for i in requeued.history] == ["REQUEUED", "RUNNING"] and requeued.restarts == 1
    assert requeued.history[-1].end is None  # Unknown: still running
    first = requeued.history[0]
    assert first.start is not None and first.end is not None and first.end - first.start == 4


def test_sacct_node_fail_with_a_reason_and_a_heterogeneous_job() -> None:
    text = ("201|NODE_FAIL|None|node2|00:01:10|0:0|2026-01-01T10:00:00|2026-01-01T10:00:05|2026-01-01T10:01:15\n"
            "201|COMPLETED|None|node1|00:05:00|0:0|2026-01-01T10:01:15|2026-01-01T10:02:00|2026-01-01T10:07:00\n"
            "300+0|FAILED|NonZeroExitCode|node1|00:00:02|1:0|2026-01-01T11:00:00|2026-01-01T11:00:01|"
            "2026-01-01T11:00:03\n"
            "300+1|COMPLETED|None|node2|00:00:02|0:0|2026-01-01T11:00:00|2026-01-01T11:00:01|2026-01-01T11:00:03\n")
    jobs = parse.sacct(text)
    assert jobs["201"].restarts == 1 and cause_of_previous([i.state for i in jobs["201"].history]) == (
        "node_failure", "slurm state NODE_FAIL")
    assert base_id("300+1") == base_id("300_7") == base_id("300.batch") == "300"
    assert jobs["300+0"].state == "FAILED"


def test_sacct_a_no_kill_job_that_lost_a_node_is_one_incarnation() -> None:
    """Recorded on the dev cluster: `sbatch -N 3 --no-kill`, node2 set DOWN under a 2-node step."""
    text = ("14|RESIZING|None|node[1-3]|00:00:05|0:0|2026-12-02T09:04:45|2026-12-02T09:04:46|2026-12-02T09:04:51\n"
            "14|COMPLETED|None|node[1,3]|00:00:07|0:0|2026-12-02T09:04:51|2026-12-02T09:04:51|2026-12-02T09:04:58\n")
    job = parse.sacct(text)["14"]
    assert (job.state, job.restarts, job.nodes, job.elapsed) == ("COMPLETED", 0, "node[1,3]", "00:00:12")
    (only,) = job.history
    assert only.start is not None and only.end is not None and only.end - only.start == 12


@pytest.mark.parametrize(("text", "seconds"), [("1:00:00", 3600), ("59:30", 3570), ("2-03:04:05", 183845),
                                               ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("", None),
                                               ("7|RUNNING|None|node1|0:05|7", None), ("1:2:3:4", None)])
def test_time_left(text: str, seconds: float | None) -> None:
    assert parse.time_left(text + "\n") == seconds


def test_recorded_time_left_and_the_signal_cause() -> None:
    left = parse.time_left(recorded("squeue-timeleft.txt"))
    assert left == 3600
    assert cause_of_signal(left, 120)[0] == "preemption"  # an hour to spare: not the time limit
    assert cause_of_signal(150, 120) == ("timeout", "150 s left of the time limit")
    assert cause_of_signal(None, 120)[0] == "preemption"


def test_restart_cause_from_accounting() -> None:
    states = [i.state for i in parse.sacct(recorded("sacct.txt"))["115"].history]
    assert cause_of_previous(states) == ("requeue", "slurm state REQUEUED")
    assert cause_of_previous(["PREEMPTED", "RUNNING"])[0] == "preemption"
    assert cause_of_previous(["TIMEOUT", "RUNNING"])[0] == "timeout"
    assert cause_of_previous(["RUNNING"]) == ("unknown", "no marker and no accounting record")


def test_scontrol_show_config_and_partition() -> None:
    conf = parse.config(recorded("scontrol-show-config.txt"))
    assert conf["MaxArraySize"] == "1001" and conf["ClusterName"] == "slurmkit"
    assert conf["SLURM_VERSION"] == "22.05.8" and conf["KillWait"] == "5 sec"
    part = parse.oneliner(recorded("scontrol-show-partition.txt"))
    assert part["PartitionName"] == "debug" and part["TotalNodes"] == "2" and part["MaxTime"] == "01:00:00"
    assert part["TRES"] == "cpu=4,mem=16000M,node=2,billing=4"


def test_parsers_skip_what_is_not_theirs() -> None:
    assert parse.squeue("squeue: error: Invalid user\n\n") == {}
    assert parse.sacct("garbage\n|||\n") == {}
    assert parse.epoch("Unknown") is None and parse.epoch("None") is None


def test_unusable_nodes_between_two_steps() -> None:
    """`sinfo --Node --format="%N %t"`: one line per node and partition (the dev cluster has three)."""
    healthy = "node1 idle\nnode1 idle\nnode1 idle\nnode2 alloc\nnode2 alloc\nnode2 mix\n"
    assert parse.unusable_nodes(healthy) == []
    # Written by hand in the same format: down, not responding (*), draining, failing, powered down (~).
    odd = "node1 alloc\nnode2 down\nnode3 mix*\nnode4 drng\nnode5 fail\nnode6 idle~\nnode7 comp\nnode8 drain\n"
    assert parse.unusable_nodes(odd) == ["node2", "node3", "node4", "node5", "node8"]
    assert parse.unusable_nodes("sinfo: error: Unable to contact slurm controller\n") == []


def test_tres_limits_read_nodes_cpus_and_every_gpu_gres() -> None:
    from slurmkit.slurm.limits import parse_tres

    assert parse_tres("cpu=8,mem=100G,node=2,gres/gpu=4") == {"cpu": 8, "node": 2, "gres/gpu": 4}
    assert parse_tres("gres/gpu:a100=2,gres/gpu:h100=1,billing=9") == {"gres/gpu": 3}
    assert parse_tres("") == {}
