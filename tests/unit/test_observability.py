"""Observability without a cluster: filesystem bench, doctor on the local profile, goodput accounting,
and the report of a real local training run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.config.profile import Resources
from slurmkit.insight import goodput
from slurmkit.slurm.parse import Incarnation
from tests.conftest import EXAMPLES, ROOT

runner = CliRunner()


def test_bench_fs_compares_with_dd_on_the_same_path_and_cleans_up(tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", "fs", str(tmp_path), "--size", "8MiB", "--checkpoint-size", "40GB",
                                 "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["bytes"] == 8 * 2**20 and out["write_MBps"] > 0 and out["dd_write_MBps"] > 0
    assert out["write_vs_dd"] > 0 and out["checkpoint_bytes"] == 40 * 10**9  # GB as printed back: 1000s
    # write_MBps, not write_s: 8 MB can take a few ms, which 3 decimals of write_s cannot carry to 5%.
    assert out["estimated_save_s"] == pytest.approx(40e9 / (out["write_MBps"] * 1e6), rel=0.05)
    assert list(tmp_path.iterdir()) == [], "the bench left files behind"


def test_bench_fs_on_an_object_store_has_no_dd_baseline() -> None:
    out = json.loads(runner.invoke(app, ["bench", "fs", "memory://bench", "--size", "2MB", "--json"]).output)
    assert out["baseline"].startswith("none") and "write_vs_dd" not in out


@pytest.mark.parametrize("size", ["lots", "8", "512KiB"])
def test_bench_fs_refuses_a_bad_or_tiny_size_in_one_line(tmp_path: Path, size: str) -> None:
    """Under dd's 1 MiB block the run would compare a few bytes with a MiB."""
    result = runner.invoke(app, ["bench", "fs", str(tmp_path), "--size", size])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("error: --size:") and list(tmp_path.iterdir()) == []


WITHOUT_S3FS = ("import sys; sys.modules['s3fs'] = None; "  # Python's own way to make an import fail: not installed
                "from slurmkit.cli.app import main; sys.argv[0] = 'slurmkit'; main()")


def test_bench_fs_and_doctor_on_s3_without_s3fs_say_so_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bench = subprocess.run([sys.executable, "-c", WITHOUT_S3FS, "bench", "fs", "s3://bucket/ckpt", "--size", "1MiB"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert bench.returncode == 2 and len(bench.stderr.strip().splitlines()) == 1, bench.stderr
    assert "slurmkit[s3]" in bench.stderr
    profile = tmp_path / "s3.yaml"
    profile.write_text(f"extends: local\nrun_root: {tmp_path / 'runs'}\ncheckpoint_root: s3://bucket/ckpt\n")
    doctor = subprocess.run([sys.executable, "-c", WITHOUT_S3FS, "doctor", "-p", str(profile), "--json"],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["checkpoint_root"]["status"] == "FAIL" and "slurmkit[s3]" in checks["checkpoint_root"]["detail"]


def test_doctor_on_the_local_profile_needs_no_slurm(local_profile: Path) -> None:
    result = runner.invoke(app, ["doctor", "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["slurm"]["status"] == "SKIP" and checks["run_root"]["status"] in ("PASS", "WARN")


def test_doctor_fails_an_unwritable_checkpoint_root_with_a_fix(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    blocker = tmp_path / "file"
    blocker.write_text("")
    profile.write_text(f"extends: local\nrun_root: {tmp_path}/runs\ncheckpoint_root: {blocker}/sub\n")
    result = runner.invoke(app, ["doctor", "-p", str(profile)])
    assert result.exit_code == 1
    assert "FAIL  checkpoint_root" in result.output and "fix: create" in result.output


def test_goodput_splits_wall_time_into_productive_and_lost() -> None:
    # Two incarnations: steps 1-4, preempted after a save at step 2, requeued; steps 3-6 again.
    incs = [Incarnation("7", 0.0, 10.0, 20.0, "REQUEUED", "node1"),
            Incarnation("7", 20.0, 25.0, 40.0, "COMPLETED", "node1")]
    steps = [{"step": s, "time": t, "step_s": 1.0, "ckpt_stall_s": 0.5 if s == 2 else 0.0}
             for s, t in [(1, 12.0), (2, 13.0), (3, 14.0), (4, 15.0), (3, 28.0), (4, 29.0), (5, 30.0), (6, 31.0)]]
    gp = goodput.account(steps, incs)
    assert gp.wall_s == 30.0 and gp.productive_s == 6.0 and gp.steps == 6
    assert gp.recomputed_s == 2.0 and gp.checkpoint_stall_s == 0.5
    assert gp.queue_wait_s == 5.0 and gp.restart_overhead_s == 2.0  # running at 25, first step began at 27
    assert gp.other_s == pytest.approx(30.0 - 6.0 - 2.0 - 0.5 - 5.0 - 2.0)
    assert gp.goodput == pytest.approx(0.2)


def test_goodput_counts_a_slow_first_step_after_a_restart_as_restart_overhead() -> None:
    # The restarted incarnation's first step took 3 s where a step takes 1 s (imports deferred to it):
    # 2 s of it are restart cost, not productive time.
    incs = [Incarnation("7", 0.0, 10.0, 15.0, "REQUEUED", "node1"),
            Incarnation("7", 15.0, 20.0, 40.0, "COMPLETED", "node1")]
    steps = [{"step": s, "time": t, "step_s": d}
             for s, t, d in [(1, 12.0, 1.0), (2, 13.0, 1.0), (3, 24.0, 3.0), (4, 25.0, 1.0)]]
    gp = goodput.account(steps, incs)
    # began at 21 (1 s after running), +2 s slow
    assert goodput.of_records(steps, incs).restart_overheads() == [1.0 + 2.0]
    assert gp.productive_s == 4.0 and gp.restart_overhead_s == 3.0 and gp.recomputed_s == 0.0


def test_goodput_counts_an_in_job_restart_from_the_step_before_it_as_restart_overhead() -> None:
    # One incarnation; the ranks fail after step 4 (its record at 15), a new srun step's first step
    # (a new process: `startup`) resumes at step 3, begins at 19 and takes 3 s; later a warm restart's
    # first step (`warm_restart`) resumes at step 5 and begins 0.5 s after step 6 ended.
    incs = [Incarnation("7", 0.0, 10.0, 40.0, "COMPLETED", "node1")]
    rows: list[tuple[int, float, float, dict[str, Any]]] = [
        (1, 12.0, 1.0, {"startup": {}}), (2, 13.0, 1.0, {}), (3, 14.0, 1.0, {}), (4, 15.0, 1.0, {}),
        (3, 22.0, 3.0, {"startup": {}}), (4, 23.0, 1.0, {}), (5, 24.0, 1.0, {}), (6, 25.0, 1.0, {}),
        (5, 26.5, 1.0, {"warm_restart": {}}), (6, 27.5, 1.0, {}), (7, 28.5, 1.0, {})]
    steps = [{"step": s, "time": t, "step_s": d, **extra} for s, t, d, extra in rows]
    acc = goodput.of_records(steps, incs)
    assert acc.restart_overheads() == [] and acc.in_job_overheads() == [4.0 + 2.0, 0.5]
    gp = acc.result()
    assert gp.restart_overhead_s == 6.5 and gp.productive_s == 7.0 and gp.recomputed_s == 4.0


def test_report_of_a_local_run_draws_a_png(tmp_path: Path, local_profile: Path) -> None:
    result = runner.invoke(app, ["submit", str(EXAMPLES / "train_digits.yaml"), "-p", str(local_profile), "--set",
                                 "config.steps=40", "--wait", "--json"])
    assert result.exit_code == 0, result.output
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    result = runner.invoke(app, ["report", str(run_dir), "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    png = run_dir / "report.png"
    assert info["report"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
    assert info["goodput"]["steps"] == 40 and 0 < info["goodput"]["goodput"] <= 1
    bad = runner.invoke(app, ["report", str(run_dir), "-p", str(local_profile), "-o", str(tmp_path / "r.pdf")])
    assert bad.exit_code == 2 and "valid: a .png or .html file" in bad.output


@pytest.mark.parametrize("conf, sacct_rc, says", [
    ("accounting_storage/none", 0, "AccountingStorageType=accounting_storage/none"),
    ("accounting_storage/slurmdbd", 1, "sacct fails"),
    ("accounting_storage/slurmdbd", 0, None),
])
def test_doctor_warns_what_is_degraded_without_accounting_stand_in_scontrol_and_sacct(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conf: str, sacct_rc: int, says: str | None) -> None:
    import os

    from slurmkit.insight import doctor

    for name, body in (("scontrol", f'echo "AccountingStorageType   = {conf}"'),
                       ("sacct", f'echo "slurmdbd: connection refused" >&2; exit {sacct_rc}')):
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr("slurmkit.slurm.commands.QUERY_ATTEMPTS", 1)
    check = doctor._accounting()
    if says is None:
        assert check.status == doctor.PASS
    else:
        assert check.status == doctor.WARN and says in check.detail and "run folders" in check.detail


def _report_data(gpu: list[dict[str, Any]]) -> Any:
    """A run of 200 steps in records of 10, its loss falling from 4 to 0.04, restarted at step 120."""
    from slurmkit.insight import report

    curve = report.Curve()
    records = [{"step": s, "steps": 10, "loss": 4.0 * 0.977 ** s, "loss_min": 3.0 * 0.977 ** s,
                "loss_max": 5.0 * 0.977 ** s, "step_s": 0.1, "step_s_sum": 1.0, "samples_per_s": 640.0,
                "mfu": 0.01, "time": 1000.0 + s / 10} for s in range(10, 201, 10)]
    for rec in reversed(records):
        curve.add(rec)
    acc = goodput.of_records(records, []).result()
    seg = report.Segment("7", 0, 990.0, 1000.0, 1020.0, "COMPLETED", "node[1-2]")
    return report.ReportData("r1", curve.points(), gpu, [seg], acc, {}, [(120, "preemption")])


def test_the_report_draws_loss_as_a_line_with_its_spread_on_a_log_scale_and_marks_every_restart() -> None:
    from matplotlib.collections import PolyCollection

    from slurmkit.insight import report

    fig = report.figure(_report_data([]))
    loss_ax = next(ax for ax in fig.axes if ax.get_ylabel() == "loss")
    assert loss_ax.get_yscale() == "log"
    (line,) = [ln for ln in loss_ax.get_lines() if ln.get_gid() != "restart"]
    assert line.get_linestyle() == "-" and len(line.get_xdata()) == 20  # a line, one point a record
    (band,) = [c for c in loss_ax.collections if isinstance(c, PolyCollection)]
    vertices: Any = band.get_paths()[0].vertices  # numpy's stubs type the array loosely
    lows = [float(y) for _, y in vertices]
    assert min(lows) == pytest.approx(3.0 * 0.977 ** 200, rel=1e-6)  # the band reaches the interval's min
    # The restart is marked at its step on both curves, its cause written on the loss.
    marked = [ax for ax in fig.axes if any(ln.get_gid() == "restart" and ln.get_xdata()[0] == 120
                                           for ln in ax.get_lines())]
    assert len(marked) == 2 and [t.get_text() for t in loss_ax.texts] == ["preemption"]
    # No panel without data: no GPU panel on a run without GPU samples; wall time on the loss's top axis.
    assert not any("GPU" in ax.get_ylabel() for ax in fig.axes)
    assert any("wall seconds" in ax.get_xlabel() for ax in loss_ax.child_axes)
    with_gpu = report.figure(_report_data([{"host": "node1", "time": 1005.0, "gpus": [{"util_pct": 80}]}]))
    assert any("GPU" in ax.get_ylabel() for ax in with_gpu.axes)


def test_the_report_draws_the_slowest_ranks_scores_over_time() -> None:
    """scores.jsonl's readings: one line for each rank that was among the slowest (the lowest first),
    the median beside them; the HTML page lists the same ranks."""
    from slurmkit.insight import report, report_data, report_html

    data = _report_data([])
    data.scores = [{"time": 1000.0 + t, "median": 1.0, "slowest": [[3, 0.3 + t / 100], [1, 0.9]]} for t in range(5)]
    assert report_data.rank_series(data.scores) == [3, 1]
    fig = report.figure(data)
    (ax,) = [ax for ax in fig.axes if "straggler" in ax.get_ylabel()]
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}
    assert lines["rank 3"] == pytest.approx([0.3, 0.31, 0.32, 0.33, 0.34]) and lines["median"] == [1.0] * 5
    assert not any("straggler" in a.get_ylabel() for a in report.figure(_report_data([])).axes)
    assert report_html.render(data).count("<td>3</td><td>0.30</td><td>0.34</td><td>5</td>") == 1


def test_cost_sums_every_incarnations_node_hours_and_splits_out_what_was_lost() -> None:
    from slurmkit.insight import cost

    incs = [Incarnation("7", 0.0, 100.0, 460.0, "REQUEUED", "node[1-2]"),  # 360 s on 2 nodes
            Incarnation("7", 470.0, 500.0, 680.0, "COMPLETED", "node[1-2]"),  # 180 s on 2 nodes
            Incarnation("8", 690.0, None, None, "CANCELLED", "")]  # never ran: costs nothing
    spent = cost.of_run(incs, cost.gpus_per_node(Resources(gpus_per_task=2, tasks_per_node=4)), productive_s=432.0)
    assert spent.node_hours == pytest.approx(2 * 540 / 3600)
    assert spent.gpu_hours == pytest.approx(8 * spent.node_hours)
    assert spent.lost_node_hours == pytest.approx(2 * (540 - 432) / 3600)  # held 540 s a node, 432 s of steps
    assert cost.of_run(incs, 0, 0.0).gpu_hours == 0  # a CPU run


def test_a_dollar_in_a_cause_or_host_is_drawn_as_text_not_parsed_as_maths() -> None:
    import dataclasses

    from slurmkit.insight import report

    data = _report_data([{"host": "gpu$node$1", "time": 1005.0, "gpus": [{"util_pct": 80}]}])
    data = dataclasses.replace(data, restarts=[(120, r"oom $\foo$ at $x")])
    png = report.render_png(data)  # mathtext raised ValueError on $\foo$ before
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    loss_ax = next(ax for ax in report.figure(data).axes if ax.get_ylabel() == "loss")
    assert [t.get_text() for t in loss_ax.texts] == [r"oom \$\foo\$ at \$x"]
