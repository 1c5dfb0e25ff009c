"""The login host's side of the Python API from a laptop (slurmkit.remote.api): one method of an
Executor or a Job, run here with this side's own library; its answer as one JSON line.

Its own entry (`python -P -m slurmkit.api.serve_call REQUEST`): the API's imports (the executor,
the handles) stay out of slurmkit.cli.serve_command, which every CLI command from a laptop starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from slurmkit import trust
from slurmkit.api.executor import Executor
from slurmkit.api.handles import Job, states
from slurmkit.errors import SlurmkitError
from slurmkit.jsontypes import JsonObject
from slurmkit.remote import login_side
from slurmkit.remote.api import CALL_FILE, as_answer, as_error
from slurmkit.remote.request import Request


def answer(api: JsonObject, stage: Path, profile: str) -> JsonObject:
    """The method's value (as_answer), or its error (as_error) for the laptop to raise as it is."""
    try:
        return as_answer(_value(api["method"], api["params"], stage, profile))
    except SlurmkitError as exc:
        return as_error(exc)


def _ids(job: Job) -> dict[str, str]:
    return {"run_id": job.run_id, "job_id": job.job_id, "run_dir": job.run_dir}


def _value(method: str, params: JsonObject, stage: Path, profile: str) -> Any:
    if method in ("submit", "map_array", "submit_command"):
        ex = Executor(profile, **params["executor"])
        if method == "submit_command":
            return [_ids(ex.submit_command(params["command"]))]
        # Loaded from the private stage this request made (0700, the caller's own), never from elsewhere.
        fn, rest = trust.load_pickle(stage / CALL_FILE, "the laptop's call", folders=(stage,))
        if method == "submit":
            return [_ids(ex.submit(fn, *rest[0], **rest[1]))]
        return [_ids(j) for j in ex.map_array(fn, *rest, max_parallel=params.get("max_parallel"),
                                                    max_array_size=params.get("max_array_size"))]
    if method == "from_id":
        return _ids(Job.from_id(params["ident"], profile))
    if method == "states":
        handles = [Job(**ids) for ids in params["jobs"]]
        now = states(handles)
        return [now[j] for j in handles]
    job = Job(**params["job"])
    if method == "state":
        return job.state
    if method == "done":
        return job.done()
    if method == "wait":
        return job.wait(params.get("timeout"), params.get("poll_s", 1.0))
    if method == "results":
        return job.results(params.get("timeout"), params.get("ranks"))
    if method == "logs":
        return job.logs(params.get("rank"))
    if method == "cancel":
        return job.cancel()
    raise SlurmkitError(f"unknown API method {method!r}", where="slurmkit.api.serve_call")


def print_answer(api: JsonObject, stage: Path, profile: str) -> int:
    print(json.dumps(answer(api, stage, profile)), flush=True)
    return 0


def main(args: list[str]) -> int:
    try:
        return login_side.api(Request.decode(args[0] if args else ""), print_answer)
    except SlurmkitError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
