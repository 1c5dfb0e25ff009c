"""A search sweep's Optuna study: its journal in the sweep folder (SweepPaths.study, JSON lines, no
server and no pickle), the sampler and pruner the spec names (config.search), the params as
Optuna's distributions, and the typed view the login side reads (Trial).

Trial i of the study is task i of the sweep: the driver (sweeps.search) asks trials in order and
adds each to the manifest under its number. Optuna is imported here only, where a search is
driven or read; the rest of the login CLI never loads it.
"""

from __future__ import annotations

import fcntl
import importlib
import logging
import os
import socket
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from slurmkit import trust
from slurmkit.common.sweep_layout import SweepPaths
from slurmkit.config.search import PruneSection, SearchSection
from slurmkit.errors import ConfigError
from slurmkit.jsontypes import JsonObject
from slurmkit.runs.procs import start_time

if TYPE_CHECKING:
    import optuna

# Trial states as `sweep status` and the Python API show them (Optuna's names).
COMPLETE, PRUNED, FAIL, RUNNING, WAITING = "COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING"


def optuna_module() -> Any:
    """Optuna, or one line saying how to get it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("a search sweep needs Optuna, which is not installed", where="sweep.search",
                          valid="valid: pip install 'slurmkit[search]' (or optuna) where slurmkit runs") from None
    optuna.logging.set_verbosity(logging.WARNING)
    # qmc and bruteforce are marked experimental; the spec chose them, the driver's log need not say so.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def distributions(search: SearchSection) -> JsonObject:
    """Each param's Optuna distribution, by its dotted key."""
    d = optuna_module().distributions
    out: JsonObject = {}
    for key, spec in search.params.items():
        kind, args = next(iter(spec.items()))
        if kind == "choice":
            out[key] = d.CategoricalDistribution(args)
        elif kind == "int":
            out[key] = d.IntDistribution(int(args[0]), int(args[1]))
        else:
            out[key] = d.FloatDistribution(float(args[0]), float(args[1]), log=kind == "log_uniform")
    return out


def sampler(search: SearchSection, asked: int = 0) -> Any:
    """The sampler the spec names, for the batch after `asked` trials. TPE asked for a batch at
    once lies about the pending trials (constant liar), so that one batch spreads out rather than
    repeating one guess.

    Seeded with seed + asked: a sampler's generator lives in its process, not in the study, so a
    driver started again (or the next batch, asked in another process than the first) would
    otherwise draw the same numbers again. So seeded, a resumed search asks exactly what an
    uninterrupted one would. QMC keeps the one seed: its sequence goes on from the study's count."""
    s = optuna_module().samplers
    seed = search.seed if search.sampler == "qmc" else search.seed + asked
    if search.sampler == "tpe":
        return s.TPESampler(seed=seed, constant_liar=search.batch > 1)
    if search.sampler == "random":
        return s.RandomSampler(seed=seed)
    needs = {"cmaes": "cmaes", "qmc": "scipy"}.get(search.sampler)
    if needs is not None:
        try:  # Optuna imports it only when the sampler first samples: in the driver, after the submit
            importlib.import_module(needs)
        except ImportError:
            raise ConfigError(f"sampler {search.sampler} needs the {needs} package", where="sweep.search.sampler",
                              valid=f"valid: pip install 'slurmkit[search]' (or {needs}), or another sampler") from None
    if search.sampler == "cmaes":
        return s.CmaEsSampler(seed=seed)
    if search.sampler == "grid":
        return s.GridSampler({k: v["choice"] for k, v in search.params.items()}, seed=seed)
    if search.sampler == "qmc":
        return s.QMCSampler(seed=seed)
    if search.sampler == "nsgaii":
        return s.NSGAIISampler(seed=seed)
    return s.BruteForceSampler(seed=seed)


def pruner(prune: PruneSection | None) -> Any:
    p = optuna_module().pruners
    if prune is None or prune.pruner == "nop":
        return p.NopPruner()
    if prune.pruner == "median":
        return p.MedianPruner(n_startup_trials=prune.startup_trials, n_warmup_steps=prune.warmup_steps)
    if prune.pruner == "percentile":
        return p.PercentilePruner(prune.percentile, n_startup_trials=prune.startup_trials,
                                  n_warmup_steps=prune.warmup_steps)
    if prune.pruner == "hyperband":
        return p.HyperbandPruner(min_resource=prune.min_resource, max_resource=prune.max_resource or "auto")
    if prune.pruner == "successive_halving":
        return p.SuccessiveHalvingPruner(min_resource=prune.min_resource)
    return p.ThresholdPruner(lower=prune.lower, upper=prune.upper, n_warmup_steps=prune.warmup_steps)


class StudyLock:
    """The journal's write lock (Optuna's BaseJournalFileLock, by its two methods): a kernel lock
    (flock) on `study.journal.lock`, so a holder that dies, however it dies, holds nothing; a live one
    is waited for, never broken after a grace period (which could let two writers in). The file
    names its holder while it holds it; a name left there by a holder that died is taken over with
    one line on stderr. On NFS, Linux takes a flock as a lock of the whole file (NFSv3's NLM, NFSv4's
    own locks): seen by every client, and freed by the server once a client that died lets its lease go."""

    def __init__(self, journal: str) -> None:
        self.path = journal + ".lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        os.close(trust.open_append(self.path, 0o600))  # made private, never through a planted link
        fd = trust.open_own(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            left = os.pread(fd, 256, 0).decode(errors="replace").strip()
            if left:
                print(f"slurmkit: took over {self.path} from its holder ({left}), which is gone", file=sys.stderr,
                      flush=True)
            me = f"pid {os.getpid()} on {socket.gethostname()} started {start_time(os.getpid())}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return True

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.ftruncate(fd, 0)  # released: the next holder finds no name, so says nothing
            os.close(fd)  # and with it the flock


def _storage(paths: SweepPaths) -> Any:
    """The study's journal storage. The sweep folder and the journal are the caller's own, checked
    here: what another user planted would steer the search."""
    optuna = optuna_module()
    from optuna.storages.journal import JournalFileBackend

    trust.check(trust.reason(paths.sweep_dir), str(paths.sweep_dir), "valid: a sweep folder of your own")
    os.close(trust.open_append(paths.study, 0o600))  # made here, never through a planted link
    os.close(trust.open_own(paths.study))
    backend = JournalFileBackend(str(paths.study), lock_obj=StudyLock(str(paths.study)))  # type: ignore[arg-type]
    return optuna.storages.JournalStorage(backend)


def open_study(paths: SweepPaths, search: SearchSection, prune: PruneSection | None) -> optuna.Study:
    """The sweep's study, to ask and tell (made on first open)."""
    direction = "minimize" if search.mode == "min" else "maximize"
    return optuna_module().create_study(storage=_storage(paths), study_name=paths.sweep_id, direction=direction,
                                        sampler=sampler(search), pruner=pruner(prune), load_if_exists=True)


def read_trials(paths: SweepPaths) -> list[Trial]:
    """The study's trials as they stand, read without its write lock (Optuna takes it to write
    only): `sweep status` never waits on a driver, nor writes; none before the study was made."""
    optuna = optuna_module()
    try:
        opened = optuna.load_study(study_name=paths.sweep_id, storage=_storage(paths))
    except KeyError:  # the journal holds no study yet
        return []
    return trials(opened)


def tell(opened: optuna.Study, number: int, value: float | None = None, state: Any = None) -> None:
    """Tell the study how trial `number` ended (once: a trial already told is left as it is).

    The grid and brute-force samplers stop the study (Study.stop) when their last point is told,
    which raises outside Optuna's own optimize loop; the tell is stored before that
    (optuna.study._tell), so it is done, and the search ends by its budget (trials <= the number
    of points, config.search)."""
    try:
        opened.tell(number, value, state=state, skip_if_finished=True)
    except RuntimeError:
        if type(opened.sampler).__name__ not in ("GridSampler", "BruteForceSampler"):
            raise


RETRY_OF = "slurmkit_retry_of"
"""The user attribute of a trial enqueued again by `sweep resubmit --failed`: the failed trial's number."""


def budget(opened: optuna.Study, search: SearchSection) -> int:
    """The trials the search runs in all: the spec's, plus each failed trial enqueued again."""
    return search.trials + sum(RETRY_OF in t.user_attrs for t in opened.get_trials(deepcopy=False))


def retry_failed(opened: optuna.Study) -> list[int]:
    """Enqueue again, with the same params, every failed trial not yet retried: the next batch asks
    these first, as new trials (a trial's number stays its task's index). Their numbers."""
    ts = optuna_module().trial.TrialState
    found = opened.get_trials(deepcopy=False)
    retried = {t.user_attrs[RETRY_OF] for t in found if RETRY_OF in t.user_attrs}
    failed = [t for t in found if t.state == ts.FAIL and t.number not in retried]
    for t in failed:
        opened.enqueue_trial(dict(t.params), user_attrs={RETRY_OF: t.number})
    return [t.number for t in failed]


@dataclass(frozen=True)
class Trial:
    """One trial as the login side shows it: its task index, state, params and value."""

    number: int
    state: str
    """COMPLETE, PRUNED, FAIL, RUNNING or WAITING (Optuna's)."""
    params: JsonObject
    value: float | None
    steps: int
    """Intermediate values reported to the pruner."""

    def as_dict(self) -> JsonObject:
        return asdict(self)


def trials(study: optuna.Study) -> list[Trial]:
    return [Trial(t.number, t.state.name, dict(t.params), t.value, len(t.intermediate_values))
            for t in study.get_trials(deepcopy=False)]


def best(found: list[Trial], mode: str) -> Trial | None:
    """The completed trial with the best value (None before one completes)."""
    done = [(t.value if mode == "min" else -t.value, t) for t in found if t.state == COMPLETE and t.value is not None]
    return min(done, key=lambda pair: pair[0])[1] if done else None
