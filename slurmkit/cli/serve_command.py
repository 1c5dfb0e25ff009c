"""The login host's entry for a command forwarded from a laptop: `python -P -m slurmkit.cli.serve_command
REQUEST` (slurmkit.remote.request). The command runs here, in this process, in the stage its files
were unpacked to (slurmkit.remote.login_side); `hello` and `fetch` are answered without a command.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from slurmkit.cli.app import app
from slurmkit.errors import SlurmkitError
from slurmkit.remote import login_side
from slurmkit.remote.request import STAGE_PREFIX, Request
from slurmkit.runs import snapshot


def _argv(req: Request, stage: Path) -> list[str]:
    argv = [str(stage / a[len(STAGE_PREFIX):]) if a.startswith(STAGE_PREFIX) else a for a in req.argv]
    return [*argv, "-p", str(login_side.profile_file(req))]


def run(req: Request) -> int:
    """The command, run here with the files sent along in the stage; its exit status."""
    req.check_versions(login_side.hello())
    with login_side.staging(req, keep_output=True) as stage:
        # A run without the code sent along starts in the login account's home, as `ssh HOST sbatch`
        # would: never in the stage, which is gone once the command returns.
        os.chdir(stage / "work" / req.workdir if (stage / "work").is_dir() else Path.home())
        if req.origin:
            os.environ[snapshot.ORIGIN_ENV] = json.dumps(req.origin)
        try:
            app(args=_argv(req, stage), prog_name="slurmkit", standalone_mode=True)
            return 0
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def main(args: list[str]) -> int:
    try:
        req = Request.decode(args[0] if args else "")
        if req.op == "hello":
            print(json.dumps(login_side.hello()))
            return 0
        if req.op == "fetch":
            return login_side.fetch(req.stage_id)
        if req.op == "api":
            raise SlurmkitError("an API request goes to slurmkit.api.serve_call", where="slurmkit.cli.serve_command")
        return run(req)
    except SlurmkitError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
