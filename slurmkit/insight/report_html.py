"""The HTML report: one self-contained, interactive page (report.js draws its panels as SVG from the
data the page carries: zoom, hover, every restart marked; nothing fetched from the network), then the
goodput, cost, incarnation and code tables."""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from typing import Any

from slurmkit.insight.report_data import ReportData, headline, rank_series
from slurmkit.jsontypes import JsonObject

STATE_COLORS = {"COMPLETED": "#2e7d32", "LOCAL": "#2e7d32", "RUNNING": "#1565c0", "REQUEUED": "#ef6c00",
                "PREEMPTED": "#ef6c00", "TIMEOUT": "#ef6c00", "NODE_FAIL": "#c62828", "FAILED": "#c62828",
                "CANCELLED": "#757575"}

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #212121; }
svg.plot { display: block; margin: 0.6em 0; max-width: 100%; height: auto; }
.title { font-size: 13px; font-weight: 600; } .legend, .tick, .label { font-size: 11px; fill: #424242; }
.grid { stroke: #eeeeee; } .line { fill: none; stroke-width: 1.4; } .band { fill: #1565c0; opacity: 0.18; }
.restart { stroke: #c62828; stroke-dasharray: 4 3; } .restart-label { font-size: 10px; fill: #c62828; }
.cursor { stroke: #9e9e9e; } .tip { font-size: 11px; fill: #000; } .area { fill: transparent; cursor: crosshair; }
.selection { fill: #1565c0; opacity: 0.12; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; } td, th { border: 1px solid #e0e0e0; padding: 2px 8px; }
"""


def page_data(data: ReportData) -> JsonObject:
    """What report.js draws: the curve (MFU in percent), GPU samples by host, restarts, incarnations."""
    gpu: list[JsonObject] = []
    hosts = sorted({g["host"] for g in data.gpu})
    t0 = min((g["time"] for g in data.gpu), default=0.0)
    for g in data.gpu:
        util = [x["util_pct"] or 0 for x in g["gpus"]]
        gpu.append({"t": round(g["time"] - t0, 3), g["host"]: sum(util) / max(len(util), 1)})
    palette = ["#6a1b9a", "#00838f", "#ad1457", "#558b2f", "#4527a0", "#ef6c00"]
    return {"run_id": data.run_id, "steps": [{**p, "mfu_pct": 100 * p.get("mfu", 0.0)} for p in data.steps],
            "gpu": gpu, "gpu_series": [{"key": h, "label": h, "color": palette[i % len(palette)]}
                                       for i, h in enumerate(hosts)],
            "restarts": data.restarts, "colors": STATE_COLORS,
            "segments": [{"n": s.n, "job_id": s.job_id, "nodes": s.nodes, "state": s.state, "cause": s.cause,
                          "queued": s.queued, "start": s.start, "end": s.end} for s in data.segments]}


def render(data: ReportData) -> str:
    """The page: the panels with data (no GPU panel without GPU samples), then the tables."""
    # Every "<" as \u003c (JSON reads it the same): "</script" would end the element early and "<!--<script"
    # would keep the page from drawing; JSON itself has "<" only inside strings. ">" and "&" likewise.
    payload = (json.dumps(_finite(page_data(data)), allow_nan=False)
               .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
    script = resources.files("slurmkit.insight").joinpath("report.js").read_text()
    title = html.escape(data.run_id)
    divs = "".join(f"<div id='{name}'></div>" for name in ("loss", "throughput", "gpu", "timeline"))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>slurmkit report {title}</title>"
            f"<style>{STYLE}</style></head><body><h1>{title}</h1>"
            f"<p>{html.escape(headline(data.accounting))}. Drag across a step panel to zoom, "
            f"double-click to zoom out, hover for a step's values.</p>{divs}"
            f"<script type='application/json' id='report-data'>{payload}</script><script>{script}</script>"
            f"{_tables(data)}</body></html>\n")


def _finite(value: object) -> Any:
    """A NaN or infinite loss (a diverged run) as null: JSON has no such numbers, and the panels skip nulls."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _tables(data: ReportData) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                   for k, v in {**data.accounting.as_dict(), **data.summary.get("cost", {})}.items())
    segs = "".join(f"<tr><td>#{s.n}</td><td>{html.escape(s.job_id)}</td><td>{html.escape(s.nodes)}</td>"
                   f"<td>{html.escape(s.state)}</td><td>{html.escape(s.cause)}</td>"
                   f"<td>{html.escape(', '.join(c for _, c in s.in_job))}</td>"
                   f"<td>{html.escape(_spans(s.startup))}</td></tr>" for s in data.segments)
    logged = "".join(f"<tr><td>{html.escape(name)}</td><td>{pts[-1][1]:.6g}</td><td>{pts[-1][0]}</td>"
                     f"<td>{len(pts)}</td></tr>" for name, pts in data.logged.items())
    logged_table = (f"<h2>Logged by the run's own code</h2><table><tr><th>name</th><th>last value</th><th>at step"
                    f"</th><th>points</th></tr>{logged}</table>") if logged else ""
    parts = "".join(f"<tr><td>{html.escape(p.part)}</td><td>#{p.restart_count}</td><td>{p.attempt}</td>"
                    f"<td>{'' if p.end is None else f'{p.end - p.start:.1f}'}</td>"
                    f"<td>{'running' if p.exit_code is None else p.exit_code}"
                    f"{' (ended by the job)' if p.by_job else ''}</td></tr>" for p in data.parts)
    parts_table = (f"<h2>Parts</h2><table><tr><th>part</th><th>incarnation</th><th>in-job attempt</th><th>seconds"
                   f"</th><th>exit</th></tr>{parts}</table>") if parts else ""
    return (f"{logged_table}{_scores(data)}{parts_table}<h2>Goodput</h2><table>{rows}</table>"
            f"<h2>Incarnations</h2><table><tr><th>#</th><th>job</th><th>nodes</th><th>state</th><th>restarted "
            f"because</th><th>in-job restarts</th><th>start-up (s)</th></tr>{segs}</table>"
            f"{_code(data.summary.get('snapshot'))}")


def _scores(data: ReportData) -> str:
    """The slowest ranks' straggler scores over the run: each one's lowest, its last and how many readings."""
    if not data.scores:
        return ""
    rows = ""
    for rank in rank_series(data.scores):
        seen = [score for r in data.scores for k, score in r["slowest"] if k == rank]
        rows += f"<tr><td>{rank}</td><td>{min(seen):.2f}</td><td>{seen[-1]:.2f}</td><td>{len(seen)}</td></tr>"
    return (f"<h2>Straggler scores</h2><p>{len(data.scores)} readings; 1.0 is the fastest rank.</p><table><tr><th>"
            f"rank</th><th>lowest</th><th>last</th><th>readings among the slowest</th></tr>{rows}</table>")


def _code(snap: JsonObject | None) -> str:
    """The code snapshot every incarnation ran (run.json), if the run took one."""
    if not snap:
        return ""
    rows = "".join(f"<tr><td>{k}</td><td>{html.escape(str(snap.get(k)))}</td></tr>"
                   for k in ("source", "git_commit", "dirty", "files", "bytes"))
    return f"<h2>Code snapshot</h2><table>{rows}</table>"


def _spans(spans: dict[str, float]) -> str:
    return ", ".join(f"{phase} {secs:.2f}" for phase, secs in spans.items())
