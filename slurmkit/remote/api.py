"""The Python API from a laptop: an Executor whose profile names a login host submits there, and
its jobs (RemoteJob) answer through the same one SSH connection as the CLI (slurmkit.remote).

A function goes as one cloudpickle (by value where the nodes could not import its module, as on
the login node), in the request's tar stream; the login host loads it from its private stage and
submits it with its own Executor. A job's return value comes back as plain data: JSON, or where
JSON cannot carry it (tuples, sets, bytes, dicts with other keys) a pickle that names no class or
function, loaded here by an unpickler that refuses every global, so no answer, whoever sent it,
can run code on the laptop. A value of any other type is refused on the login host in one line.
An error comes back as the same typed error (JobFailedError with its rank, cause and log tail)."""

from __future__ import annotations

import base64
import io
import json
import pickle
import platform
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Any

from slurmkit import __version__, errors
from slurmkit.errors import SlurmkitError
from slurmkit.jsontypes import JsonObject
from slurmkit.remote.connection import ConnectError
from slurmkit.remote.forward import Site, run_request, site_of
from slurmkit.remote.request import Request

CALL_FILE = "files/call.pkl"
# The errors a login host's answer may name; anything else comes back as a SlurmkitError.
TYPED = {c.__name__: c for c in (errors.SlurmkitError, errors.ConfigError, errors.SlurmError, errors.PreflightError,
                                 errors.RunNotFoundError, errors.JobFailedError)}


def call(site: Site, method: str, params: JsonObject, pickled: bytes | None = None) -> Any:
    """One API method on the login host; its answer, or its error raised here as the same type."""
    req = Request("api", profile=site.layers, files=pickled is not None, command=f"api {method}",
                  slurmkit=__version__, python=platform.python_version(), pickled=pickled is not None,
                  api={"method": method, "params": params})
    sender = (lambda stream: _send_pickle(stream, pickled)) if pickled is not None else None
    site.connection.open(interactive=False)  # the master the CLI uses: opened once, reused
    with tempfile.TemporaryFile() as out:
        code = run_request(site.connection, req, sender, stdout=out)
        out.seek(0)
        text = out.read().decode()
    try:
        answer = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ConnectError(f"no answer from {site.login.destination} to {method} (exit {code})",
                           where="profile:login") from None
    if "error" in answer:
        raise _error(answer["error"])
    if "pickle" in answer:
        return plain_data(base64.b64decode(answer["pickle"]))
    return answer["value"]


class _NoGlobals(pickle.Unpickler):
    """Builds lists, tuples, dicts, sets, strings, bytes and numbers; every class and function a
    pickle names (its only way to run code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}")


def plain_data(data: bytes) -> Any:
    """The value of a plain-data pickle, or SlurmkitError naming the first class it would build."""
    try:
        return _NoGlobals(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise SlurmkitError(f"an answer naming {exc} is not plain data: refused", where="slurmkit.remote.api",
                            valid="valid: results of None, bool, int, float, str, bytes, list, tuple, dict, set"
                            ) from None


def _error(err: JsonObject) -> SlurmkitError:
    cls = TYPED.get(err["class"], SlurmkitError)
    if cls is errors.JobFailedError:
        return errors.JobFailedError(err["what"], where=err["where"], valid=err["valid"], log_tail=err["log_tail"],
                                     rank=err["rank"], cause=err["cause"], trace=tuple(err["trace"]),
                                     full=err["full"])
    return cls(err["what"], where=err["where"], valid=err["valid"])


def _send_pickle(stream: Any, data: bytes) -> None:
    with tarfile.open(fileobj=stream, mode="w|") as tar:
        info = tarfile.TarInfo(CALL_FILE)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


@dataclass(frozen=True)
class RemoteJob:
    """A run on the cluster behind a login host, as slurmkit.Job: state, wait, result, logs, cancel."""

    run_id: str
    job_id: str
    run_dir: str
    """The run folder, a path on the cluster."""
    profile: str

    @property
    def _site(self) -> Site:
        site = site_of(self.profile)
        if site is None:
            raise SlurmkitError("the profile names no login host any more", where=f"{self.profile}:login")
        return site

    def _ask(self, method: str, **params: object) -> Any:
        return call(self._site, method, {"job": self.ids(), **params})

    def ids(self) -> dict[str, str]:
        return {"run_id": self.run_id, "job_id": self.job_id, "run_dir": self.run_dir}

    @property
    def state(self) -> str:
        return str(self._ask("state"))

    def done(self) -> bool:
        return bool(self._ask("done"))

    def wait(self, timeout: float | None = None, poll_s: float = 1.0) -> str:
        return str(self._ask("wait", timeout=timeout, poll_s=poll_s))

    def result(self, timeout: float | None = None) -> Any:
        return self.results(timeout, ranks=[0])[0]

    def results(self, timeout: float | None = None, ranks: list[int] | None = None) -> list[Any]:
        return list(self._ask("results", timeout=timeout, ranks=ranks))

    def logs(self, rank: int | None = None) -> str:
        return str(self._ask("logs", rank=rank))

    def cancel(self) -> list[str]:
        return list(self._ask("cancel"))


def jobs_from(profile: str, answer: list[dict[str, str]]) -> list[RemoteJob]:
    return [RemoteJob(a["run_id"], a["job_id"], a["run_dir"], profile) for a in answer]


def states(handles: list[RemoteJob]) -> dict[RemoteJob, str]:
    """Many jobs' states in one round trip per profile (as_completed polls this)."""
    out: dict[RemoteJob, str] = {}
    by_profile: dict[str, list[RemoteJob]] = {}
    for job in handles:
        by_profile.setdefault(job.profile, []).append(job)
    for group in by_profile.values():
        site = group[0]._site
        found = call(site, "states", {"jobs": [j.ids() for j in group]})
        out.update(zip(group, found, strict=True))
    return out


def submit(site: Site, profile: str, executor: JsonObject, method: str, payload: object,
           params: JsonObject | None = None) -> list[RemoteJob]:
    """submit / map_array / submit_command of an Executor on the login host; its jobs."""
    import cloudpickle

    pickled = cloudpickle.dumps(payload) if payload is not None else None
    answer = call(site, method, {"executor": executor, **(params or {})}, pickled)
    return jobs_from(profile, answer)


def from_id(site: Site, profile: str, ident: str) -> RemoteJob:
    return jobs_from(profile, [call(site, "from_id", {"ident": ident})])[0]


def as_answer(value: object) -> JsonObject:
    """What the login host prints for a value: JSON, or a pickle where JSON cannot carry it."""
    return {"value": value} if _plain(value) else _pickled(value)


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (str, int, float, bool)) or (
        isinstance(value, list) and all(isinstance(v, str) for v in value))


def _pickled(value: object) -> JsonObject:
    data = pickle.dumps(value, protocol=5)
    try:
        plain_data(data)  # what the laptop will accept, checked here: the refusal names the type
    except SlurmkitError:
        raise SlurmkitError(f"a result of type {type(value).__name__} cannot go to the laptop: only plain data does",
                            where="slurmkit.remote.api",
                            valid="valid: return None, bool, int, float, str, bytes, list, tuple, dict or set, "
                                  "or read it on the login host (`slurmkit result RUN`)") from None
    return {"pickle": base64.b64encode(data).decode()}


def as_error(exc: SlurmkitError) -> JsonObject:
    err: JsonObject = {"class": type(exc).__name__ if type(exc).__name__ in TYPED else "SlurmkitError",
                           "what": exc.what, "where": exc.where, "valid": exc.valid}
    if isinstance(exc, errors.JobFailedError):
        err |= {"log_tail": exc.log_tail, "rank": exc.rank, "cause": exc.cause, "trace": list(exc.trace),
                "full": exc.full}
    return {"error": err}
