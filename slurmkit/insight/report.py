"""`slurmkit report RUN`: one picture of a run (loss as a line with its interval's spread, on a log
scale, steps below and wall time above; throughput and MFU; GPU use where there are GPU samples; every
restart marked on the curves with its cause; the timeline of every job and incarnation with what
ended each) and its goodput accounting. matplotlib is imported only here.
"""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Any

from slurmkit.common.atomic import write_output
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import busy_s, iter_records, iter_records_reversed, numbers, steps_of
from slurmkit.common.record import RunFile
from slurmkit.errors import SlurmkitError
from slurmkit.insight import cost, goodput, report_html
from slurmkit.insight.report_data import ReportData, Segment, headline, part_spans, rank_series
from slurmkit.insight.report_html import STATE_COLORS
from slurmkit.jsontypes import JsonObject

MAX_POINTS = 2000
"""Points per curve: records are averaged into step buckets, so a report's memory does not grow with the run."""
MAX_LOGGED = 8
"""Names of the run's own logged values a report draws: the newest logged."""


class Curve:
    """Loss, throughput and MFU by step bucket, from records fed in any order (averaged by steps and by time)."""

    def __init__(self) -> None:
        self.width = 0
        # bucket -> steps, loss x steps, busy, samples/s x busy, mfu x busy, loss min, loss max, time
        self._buckets: dict[int, list[float]] = {}

    def add(self, rec: JsonObject) -> None:
        if "step" not in rec or "loss" not in rec:
            return
        step = int(rec["step"])
        self.width = self.width or max(1, -(-step // MAX_POINTS))  # the newest step sets the bucket width
        n, busy, loss = steps_of(rec), busy_s(rec), float(rec["loss"])
        inf = float("inf")
        b = self._buckets.setdefault(step // self.width, [0.0, 0.0, 0.0, 0.0, 0.0, inf, -inf, 0.0])
        b[0] += n
        b[1] += loss * n
        b[2] += busy
        b[3] += float(rec.get("samples_per_s", 0.0)) * busy
        b[4] += float(rec.get("mfu", 0.0)) * busy
        b[5] = min(b[5], float(rec.get("loss_min", loss)))
        b[6] = max(b[6], float(rec.get("loss_max", loss)))
        b[7] = max(b[7], float(rec.get("time", 0.0)))

    def points(self) -> list[dict[str, float]]:
        return [{"step": k * self.width, "loss": b[1] / b[0], "loss_min": b[5], "loss_max": b[6], "time": b[7],
                 "samples_per_s": b[3] / b[2] if b[2] else 0.0, "mfu": b[4] / b[2] if b[2] else 0.0}
                for k, b in sorted(self._buckets.items())]


def logged_points(path: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's own logged values (logged.jsonl) by name, read from the end: each name's values
    averaged into step buckets as the loss curve's, MAX_LOGGED names at most."""
    width, buckets = 0, dict[str, dict[int, list[float]]]()
    for rec in iter_records_reversed(path):
        if "step" not in rec:
            continue
        step = int(rec["step"])
        width = width or max(1, -(-step // MAX_POINTS))  # the newest step sets the bucket width
        for name, value in numbers(rec).items():
            if name in buckets or len(buckets) < MAX_LOGGED:
                b = buckets.setdefault(name, {}).setdefault(step // width, [0.0, 0.0, step])
                b[0], b[1] = b[0] + value, b[1] + 1
    return {name: [(int(b[2]), b[0] / b[1]) for _, b in sorted(points.items())] for name, points in buckets.items()}


def collect(paths: RunPaths) -> ReportData:
    """Everything the report draws: one backward pass over the metrics file, run.json restarts, one sacct call."""
    record = RunFile(paths).read()
    acc = goodput.Accountant(goodput.run_incarnations(paths, record), goodput.staging_seconds(paths))
    curve = Curve()
    for rec in iter_records_reversed(paths.metrics):
        acc.add(rec)
        curve.add(rec)
    incs = acc.incarnations
    gpu = [ln for f in sorted(paths.run_dir.glob(paths.gpu_metrics("*").name)) for ln in iter_records(f)]
    restarts = record.restarts
    # Of the restarts in run.json, the k-th that was not in-job ended incarnation k (and started k + 1).
    causes = [r.cause for r in restarts if not r.in_job]
    in_job = [(t, r.cause + (", warm" if r.kind == "warm" else "")) for r in restarts
              if r.in_job and (t := goodput.iso_epoch(r.time)) is not None]
    startups = {id(inc): goodput.startup_spans(inc, rec["startup"]) for inc, rec in acc.firsts() if "startup" in rec}
    segments = []
    for n, inc in enumerate(incs):
        queued = inc.submit if n == 0 else incs[n - 1].end
        cause = causes[n] if n < len(causes) and n < len(incs) - 1 else ""
        inside = [(t, c) for t, c in in_job if (inc.start or 0.0) <= t <= (inc.end or float("inf"))]
        segments.append(Segment(inc.job_id, n, queued, inc.start, inc.end, inc.state, inc.nodes, cause,
                                startups.get(id(inc), {}), inside))
    result = acc.result()
    spent = cost.of_run(incs if record.executor == "slurm" else [], cost.gpus_per_node(record.resources),
                        result.productive_s)
    return ReportData(paths.run_id, curve.points(), gpu, segments, result,
                      {"restarts": len(restarts), "restart_causes": [r.cause for r in restarts],
                       "in_job": [bool(r.in_job) for r in restarts], "name": record.name,
                       "lost_steps": [r.lost_steps for r in restarts], "snapshot": record.snapshot,
                       "cost": spent.as_dict()},
                      [(step, r.cause + ("" if r.kind == "requeue" else f", {r.kind.replace('_', '-')}"))
                       for r in restarts if (step := r.resumed_step if r.resumed_step is not None else r.step)
                       is not None], list(iter_records(paths.straggler_scores)),
                      part_spans(list(iter_records(paths.supervisor_events))) if record.spec and record.spec.components
                      else [], logged_points(paths.logged))


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise SlurmkitError("slurmkit report needs matplotlib", valid="install it: pip install 'slurmkit[report]'"
                            ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain(text: str) -> str:
    """A string from the run (a cause, a host, a name) drawn as it is: a `$` would start matplotlib's
    mathtext, which draws `$x$` as maths and raises on `$\\foo$`."""
    return text.replace("$", r"\$")


def _timeline(ax: Any, data: ReportData, t0: float) -> None:
    for seg in data.segments:
        y = seg.n
        if seg.queued is not None and seg.start is not None and seg.start > seg.queued:
            ax.broken_barh([(seg.queued - t0, seg.start - seg.queued)], (y - 0.3, 0.6), color="#bdbdbd")
        if seg.start is not None:
            end = seg.end or dt.datetime.now().timestamp()
            ax.broken_barh([(seg.start - t0, end - seg.start)], (y - 0.3, 0.6),
                           color=STATE_COLORS.get(seg.state, "#1565c0"))
            label = f"job {seg.job_id} #{seg.n} on {seg.nodes}: {seg.state}" + (f" ({seg.cause})" if seg.cause else "")
            ax.text(seg.start - t0, y + 0.35, plain(label), fontsize=7, va="bottom")
        for t, cause in seg.in_job:  # a new srun step in the same allocation: a mark on the bar
            ax.plot([t - t0], [y], "x", color="#c62828", markersize=7)
            ax.text(t - t0, y - 0.35, plain(f"in-job restart ({cause})"), fontsize=6, va="top")
    names = list(dict.fromkeys(p.part for p in data.parts))  # a heterogeneous run: a row per part
    for p in data.parts:
        y = len(data.segments) + names.index(p.part)
        end = p.end or dt.datetime.now().timestamp()
        color = ("#1565c0" if p.exit_code is None else "#9e9e9e" if p.by_job else "#2e7d32" if p.exit_code == 0
                 else "#c62828")
        ax.broken_barh([(p.start - t0, end - p.start)], (y - 0.3, 0.6), color=color)
        ax.text(p.start - t0, y + 0.35, plain(f"{p.part} #{p.restart_count}.{p.attempt}"
                                             + (" ended by the job" if p.by_job else f" exit {p.exit_code}"
                                                if p.exit_code else "")), fontsize=6,
                va="bottom")
    ax.set_yticks([s.n for s in data.segments] + [len(data.segments) + i for i in range(len(names))],
                  [f"#{s.n}" for s in data.segments] + [plain(n) for n in names])
    ax.set_ylim(-0.6, max(len(data.segments) + len(names), 1) - 0.2)
    ax.set_xlabel("seconds since the first submit")
    ax.set_title("timeline: queued (grey), running (colour by how it ended), in-job restarts (x); a heterogeneous "
                 "run's parts below their names (grey: ended by the job)", fontsize=9)


def _loss(ax: Any, data: ReportData) -> None:
    """The loss as a line, its interval's min to max as a band, on a log scale where it is positive."""
    steps = [p["step"] for p in data.steps]
    ax.fill_between(steps, [p["loss_min"] for p in data.steps], [p["loss_max"] for p in data.steps],
                    color="#1565c0", alpha=0.2, linewidth=0, label="min to max of each interval")
    ax.plot(steps, [p["loss"] for p in data.steps], "-", linewidth=1.0, color="#1565c0", label="loss (interval mean)")
    if data.steps and min(p["loss_min"] for p in data.steps) > 0:
        ax.set_yscale("log")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, loc="upper right")
    times = [p["time"] for p in data.steps]
    if len(steps) > 1 and all(times):  # the wall clock on the top axis: seconds since the first record
        import numpy as np

        t = np.maximum.accumulate(np.asarray(times) - times[0])
        top = ax.secondary_xaxis("top", functions=(lambda x: np.interp(x, steps, t), lambda y: np.interp(y, t, steps)))
        top.set_xlabel("wall seconds since the first record", fontsize=8)


def _restart_marks(axes: list[Any], data: ReportData) -> None:
    """A vertical line at every restart's step, on every curve; its cause written on the first."""
    for step, cause in data.restarts:
        for ax in axes:
            ax.axvline(step, color="#c62828", linewidth=0.8, linestyle="--", gid="restart")
        axes[0].annotate(plain(cause), (step, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                         va="top", ha="right", color="#c62828")


def figure(data: ReportData) -> Any:
    """The report's matplotlib figure: loss, throughput and MFU, GPU use (only with GPU samples), timeline."""
    plt = _plt()
    panels = 3 + bool(data.gpu) + bool(data.scores)
    fig, axes = plt.subplots(panels, 1, figsize=(10, 3 * panels), constrained_layout=True)
    t0 = min([s.queued or s.start or 0.0 for s in data.segments] or [0.0])
    steps = [s["step"] for s in data.steps]
    if data.steps or not data.logged:
        _loss(axes[0], data)
    else:  # a script's own loop: what it logged, as it logged it
        _logged(axes[0], data)
    # MFU is samples/s times a constant of the model: one curve, two scales.
    axes[1].plot(steps, [s.get("samples_per_s", 0.0) for s in data.steps], "-", linewidth=0.8, color="#2e7d32")
    axes[1].set_ylabel("samples/s")
    mfu_ax = axes[1].twinx()
    mfu_ax.plot(steps, [100 * s.get("mfu", 0.0) for s in data.steps], "-", linewidth=0.8, color="#ef6c00", alpha=0.6)
    mfu_ax.set_ylabel("MFU % (orange)")
    axes[1].set_xlabel("step")
    _restart_marks([axes[0], axes[1]], data)
    if data.gpu:
        for host in sorted({g["host"] for g in data.gpu}):
            rows = [g for g in data.gpu if g["host"] == host]
            util = [sum(x["util_pct"] or 0 for x in g["gpus"]) / max(len(g["gpus"]), 1) for g in rows]
            axes[2].plot([g["time"] - t0 for g in rows], util, label=plain(host))
        axes[2].legend(fontsize=7)
        axes[2].set_ylabel("GPU util % (mean)")
        axes[2].set_xlabel("seconds since the first submit")
    if data.scores:
        _scores(axes[-2], data, t0)
    _timeline(axes[-1], data, t0)
    fig.suptitle(plain(f"run {data.run_id}: {headline(data.accounting)}"), fontsize=9)
    return fig


def _scores(ax: Any, data: ReportData, t0: float) -> None:
    """Each rank that was among the slowest at some reading, its score over time; the median in grey."""
    ax.plot([r["time"] - t0 for r in data.scores], [r["median"] for r in data.scores], color="#9e9e9e",
            linewidth=0.8, label="median")
    for rank in rank_series(data.scores):
        points = [(r["time"] - t0, score) for r in data.scores for k, score in r["slowest"] if k == rank]
        ax.plot([t for t, _ in points], [v for _, v in points], ".-", linewidth=0.8, label=f"rank {rank}")
    ax.set_ylabel("straggler score (1.0: the fastest)")
    ax.set_xlabel("seconds since the first submit")
    ax.legend(fontsize=7, loc="lower left")


def _logged(ax: Any, data: ReportData) -> None:
    for name, points in data.logged.items():
        ax.plot([s for s, _ in points], [v for _, v in points], "-", linewidth=1.0, label=plain(name))
    ax.set_ylabel("logged values")
    ax.set_xlabel("step")
    ax.set_title("what the run's own code logged (slurmkit.tracking.log)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")


def render_png(data: ReportData) -> bytes:
    fig = figure(data)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    _plt().close(fig)
    return buf.getvalue()


def write(paths: RunPaths, output: Path) -> ReportData:
    """Write the report as PNG or HTML (by the file's suffix); returns what it drew."""
    if output.suffix not in (".png", ".html"):
        raise SlurmkitError(f"cannot write a report as {output.suffix or 'a file without suffix'}",
                            where=str(output), valid="valid: a .png or .html file")
    data = collect(paths)
    page = render_png(data) if output.suffix == ".png" else report_html.render(data).encode()
    write_output(output, page)
    return data
