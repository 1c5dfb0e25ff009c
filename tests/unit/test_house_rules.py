"""The house's size and import rules, held by the code itself: no module over 400 lines, no function
over 50, and slurmkit's own modules imported at the top of a file, inside a function only where the
module is heavy (it imports torch, matplotlib, submitit, ray, rich, tenacity or numpy when imported),
where a client module reaches the job's side at a meeting point (docs/design.md), or in the CLI's
command modules (slurmkit/cli/__init__.py says why)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "slurmkit"
HEAVY = {"torch", "numpy", "matplotlib", "submitit", "ray", "rich", "tenacity"}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 50


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _trees() -> dict[str, tuple[Path, ast.Module]]:
    return {_name(p): (p, ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py"))}


def _imported(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return []


def _heavy_modules(trees: dict[str, tuple[Path, ast.Module]]) -> set[str]:
    """slurmkit modules whose import (at the top of the file, followed through slurmkit) imports a heavy package."""
    top = {name: {m for node in tree.body for m in _imported(node)} for name, (_, tree) in trees.items()}
    heavy: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, deps in top.items():
            if name not in heavy and any(d.split(".")[0] in HEAVY or d in heavy for d in deps):
                heavy.add(name)
                grew = True
    return heavy


def test_no_module_over_400_lines_and_no_function_over_50() -> None:
    too_long = []
    for name, (path, tree) in _trees().items():
        if len(path.read_text().splitlines()) > MAX_MODULE_LINES:
            too_long.append(name)
        too_long += [f"{name}.{fn.name}" for fn in ast.walk(tree)
                     if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and (fn.end_lineno or fn.lineno) - fn.lineno + 1 > MAX_FUNCTION_LINES]
    assert too_long == []


def test_slurmkits_own_modules_are_imported_inside_functions_only_where_the_rules_allow() -> None:
    trees = _trees()
    heavy = _heavy_modules(trees)
    assert "slurmkit.worker.train.trainer" in heavy and "slurmkit.runs.jobs" not in heavy  # the rule sees both kinds
    hidden = []
    for name, (_, tree) in trees.items():
        if name.startswith("slurmkit.cli"):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                mods = [m for m in _imported(node) if m.startswith("slurmkit") and m in trees]
                meeting_point = not name.startswith("slurmkit.worker") and any(
                    m.startswith("slurmkit.worker") for m in mods)
                if mods and not meeting_point and not any(m in heavy for m in mods):
                    hidden.append(f"{name}:{node.lineno} {mods[0]}")
    assert hidden == []


def test_the_json_markers_are_read_and_written_only_by_common_markers() -> None:
    """slurmkit.common.markers says it is the only code that touches these files: hold it to that."""
    paths_of_markers = {"restart_request", "stop_marker", "hang_marker", "hang_markers", "health_marker",
                        "health_markers", "standby_go", "injected_marker", "command_stop", "straggler_marker",
                        "startup_marker"}
    touching = sorted(
        f"{name}:{node.lineno}" for name, (_, tree) in _trees().items()
        if name not in ("slurmkit.common.markers", "slurmkit.common.layout")
        for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in paths_of_markers)
    assert touching == []


def _edges(unit: Callable[[str], str]) -> set[tuple[str, str]]:
    """(importer's unit, imported unit) for every import of slurmkit's own modules that can run, at
    the top of a file or inside a function (a TYPE_CHECKING block never runs)."""
    edges: set[tuple[str, str]] = set()
    for name, (_, tree) in _trees().items():
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if isinstance(node, ast.stmt) and id(node) not in typing_only:
                edges |= {(unit(name), unit(m)) for m in _imported(node) if m.startswith("slurmkit.")}
    return edges


def _cycles(edges: set[tuple[str, str]]) -> set[tuple[str, ...]]:
    return {tuple(sorted((a, b))) for a, b in edges if a != b and (b, a) in edges and a and b}


def test_no_package_cycle_at_any_import() -> None:
    """No two of slurmkit's packages (or top modules) import each other, at the top of a file or
    inside a function. The pickled callables (slurmkit.calls) are a top module for this: they load
    the job's side when a rank calls them, and the job's side imports them only to type them."""
    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else ""

    edges = _edges(package)
    assert _cycles(edges) == set(), sorted(_cycles(edges))
    assert ("cli", "remote") in edges and ("common", "config") in edges  # the check sees both sides' imports


SIDES = ("worker", "supervisor")


def test_no_cycle_between_the_folders_inside_the_job_side() -> None:
    """One level down: inside worker/ and supervisor/, no two folders or top modules (worker.ft,
    worker.checkpoint, worker.train, worker.entry, ...) import each other."""
    def unit(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[1:3]) if len(parts) > 2 and parts[1] in SIDES else ""

    edges = _edges(unit)
    assert _cycles(edges) == set(), sorted(_cycles(edges))
    assert ("worker.train", "worker.checkpoint") in edges and ("worker.interrupt", "worker.ft") in edges


MAX_LAZY_OWN_IMPORTS = 8


def test_few_of_slurmkits_own_modules_are_imported_inside_functions_outside_the_cli() -> None:
    """Imports at the top say what a module needs; each one inside a function (torch, submitit or
    the job's side kept off a path that does not need them) is counted, and the count is bounded."""
    lazy = []
    for name, (_, tree) in _trees().items():
        if name.startswith("slurmkit.cli"):
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += [f"{name}:{node.lineno}" for node in ast.walk(fn) if isinstance(node, ast.stmt)
                         and any(m.startswith("slurmkit") for m in _imported(node))]
    assert 0 < len(lazy) <= MAX_LAZY_OWN_IMPORTS, sorted(lazy)


NODE_COUNT = {"nodes", "spare_nodes", "elastic"}


def test_the_node_count_is_read_from_resources_in_one_place() -> None:
    """resources.nodes, spare_nodes and elastic are read by config.shape alone (and checked where
    config validates them); the header, submitit, the plan, pre-flight and limits ask the Shape."""
    reads = []
    for name, (_, tree) in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in NODE_COUNT and (
                    (isinstance(node.value, ast.Attribute) and node.value.attr == "resources")
                    or (isinstance(node.value, ast.Name) and node.value.id in ("r", "resources"))):
                reads.append(f"{name}:{node.lineno}")
    assert sorted({r.split(":")[0] for r in reads}) == ["slurmkit.config.shape"], reads
    templates = [p.name for p in (ROOT / "templates").rglob("*.j2") if "r.nodes" in p.read_text()]
    assert templates == []


def test_cluster_tests_live_in_tests_cluster_and_only_there() -> None:
    """A test file's folder says what it needs: tests/cluster/ (each file marked `cluster`, run
    against the dev cluster) or tests/unit/ (nothing marked); the fixtures sit beside both."""
    marker = re.compile(r"^pytestmark = pytest\.mark\.cluster$", re.M)
    folders: dict[bool, set[str]] = {True: set(), False: set()}
    for path in (ROOT / "tests").rglob("test_*.py"):
        folders[bool(marker.search(path.read_text()))].add(path.relative_to(ROOT).parent.as_posix())
    assert folders == {True: {"tests/cluster"}, False: {"tests/unit"}}


MAX_UNTYPED_DICTS, MAX_ANY = 120, 400


def test_untyped_values_stay_within_their_budget() -> None:
    """JSON records are named (slurmkit.jsontypes, TypedDicts, models); a plain dict[str, Any] or an
    Any is counted, and the counts are bounded (issue 61: from 267 and 700)."""
    text = "\n".join(path.read_text() for path, _ in _trees().values())
    untyped, any_words = text.count("dict[str, Any]"), len(re.findall(r"\bAny\b", text))
    assert 0 < untyped <= MAX_UNTYPED_DICTS and 0 < any_words <= MAX_ANY, (untyped, any_words)
