"""The HTML report in a real browser (Debian's Chromium, headless): the page loads with no network,
its panels render from the data it carries, a restart is marked, no panel is drawn without data, and
a drag across the loss panel zooms the step panels. A screenshot is kept as the test's artifact
($SLURMKIT_TEST_ARTIFACTS, else the test's tmp folder)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.insight import report, report_html
from tests.unit.test_tracking import crash_then_resume, run_folder

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("CI") == "true":
    raise RuntimeError("chromium is not installed, and under CI=true the browser test must run (scripts/test.sh "
                       "installs it)")
pytestmark = [pytest.mark.usefixtures("single_process"),
              pytest.mark.skipif(CHROMIUM is None, reason="NO CHROMIUM HERE: apt-get install chromium "
                                                          "(scripts/test.sh does) to load the report in a browser")]
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files"]

# Typed into the page after report.js: drag across the middle of the loss panel, as a person would,
# then note the step axis's first and last labels of both step panels.
DRAG = """<script>
(function () {
  var area = document.querySelector("#loss rect.area"), box = area.getBoundingClientRect();
  function at(type, frac) {
    area.dispatchEvent(new MouseEvent(type, {bubbles: true, clientX: box.left + frac * box.width,
                                             clientY: box.top + box.height / 2}));
  }
  at("mousedown", 0.4); at("mousemove", 0.6); at("mouseup", 0.6);
  var loss = document.querySelector("#loss path.line").getAttribute("d").split("L").length;
  var thr = document.querySelector("#throughput path.line").getAttribute("d").split("L").length;
  document.body.setAttribute("data-zoomed", loss + "," + thr);
})();
</script>"""


def browser(*args: str) -> str:
    assert CHROMIUM is not None
    proc = subprocess.run([CHROMIUM, *HEADLESS, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def crashed_run(tmp: Path) -> RunPaths:
    """A digits run that crashed at step 25 and resumed from step 20 (30 steps)."""
    paths = run_folder(tmp, {})
    with pytest.MonkeyPatch.context() as mp:
        for key in ("SLURM_PROCID", "SLURM_NTASKS", "SUBMITIT_LOCAL_GLOBALID", "RANK", "WORLD_SIZE",
                    "SLURM_RESTART_COUNT", "SLURMKIT_CHECKPOINT_URI"):
            mp.delenv(key, raising=False)
        crash_then_resume(paths)
    return paths


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """crashed_run's report."""
    tmp = tmp_path_factory.mktemp("report")
    out = tmp / "report.html"
    report.write(crashed_run(tmp), out)
    return out


def test_the_page_renders_every_panel_with_data_and_marks_the_restart(page: Path) -> None:
    dom = browser("--dump-dom", page.as_uri())
    assert 'data-rendered="3"' in dom  # loss, throughput and MFU, timeline: no GPU panel on a CPU run
    assert re.search(r'<div id="gpu"></div>', dom)
    lines = re.findall(r'<path d="(M[^"]+)" class="line"[^>]*data-series="(\w+)"', dom)
    series = {name: d.count("L") + 1 for d, name in lines}
    assert series["loss"] == series["samples_per_s"] == 30  # a point a step (21-25, run twice, averaged)
    assert dom.count('class="restart"') == 2  # step 20, on the loss and the throughput panels
    assert "http://" not in dom.split("<script", 1)[0] and "https://" not in dom  # nothing from the network
    artifacts = Path(os.environ.get("SLURMKIT_TEST_ARTIFACTS") or page.parent)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report-html.png"
    browser(f"--screenshot={shot}", "--window-size=1024,1300", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_a_drag_across_the_loss_panel_zooms_both_step_panels(page: Path, tmp_path: Path) -> None:
    dragged = tmp_path / "dragged.html"
    dragged.write_text(page.read_text().replace("</body>", DRAG + "</body>"))
    dom = browser("--dump-dom", dragged.as_uri())
    zoomed = re.search(r'data-zoomed="(\d+),(\d+)"', dom)
    assert zoomed is not None
    loss, throughput = int(zoomed.group(1)), int(zoomed.group(2))
    assert 2 <= loss < 30 and loss == throughput  # both panels show the same, narrower range of steps


def test_markup_in_an_embedded_string_neither_breaks_nor_enters_the_page(tmp_path: Path) -> None:
    import dataclasses

    data = report.collect(crashed_run(tmp_path))
    hostile = "<!--<script>document.title='owned'</script>"
    data = dataclasses.replace(data, restarts=[(step, hostile) for step, _ in data.restarts],
                               segments=[dataclasses.replace(s, nodes=hostile) for s in data.segments])
    page = tmp_path / "hostile.html"
    page.write_text(report_html.render(data))
    dom = browser("--dump-dom", page.as_uri())
    assert 'data-rendered="3"' in dom  # every panel still drew
    assert "owned" not in dom.split("<title>", 1)[1].split("</title>", 1)[0]
