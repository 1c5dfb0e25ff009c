"""The driver of a `ray:` run, called by submitit on the first node once the batch shell has started Ray.

Ray runs with token authentication (RAY_AUTH_MODE=token): the head, the workers and the driver
read the run's Ray token from RAY_AUTH_TOKEN_PATH, a private file of the run folder derived from
the run's secret (`python -P -m slurmkit.worker.ray_driver token DIR` writes it and prints its
path, for the batch shell). A client without it is refused by every Ray service of the job.

The batch shell (templates/partials/ray.sh.j2) exports RAY_ADDRESS, SLURMKIT_RAY_NODES (how many
Ray nodes to expect) and SLURMKIT_RAY_TAG (a custom resource every node of this job carries). We
wait until exactly those nodes are alive, so a worker that joined another job's cluster (a port
clash) is an error rather than a silent merge, then run the driver script as __main__.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from slurmkit import trust
from slurmkit.common.atomic import atomic_write_text
from slurmkit.jsontypes import JsonObject

POLL_S = 0.5


class RayClusterError(RuntimeError):
    """The Ray cluster of this job did not come up whole."""


def wait_for_nodes(address: str, tag: str, expected: int, timeout_s: float) -> list[str]:
    """Block until `expected` alive nodes carry `tag` and no others are there; returns their hostnames."""
    import logging

    import ray

    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            ours = [n for n in alive if tag in n.get("Resources", {})]
            if len(alive) > len(ours):
                foreign = sorted(n.get("NodeManagerAddress", "?") for n in alive if n not in ours)
                raise RayClusterError(f"the Ray cluster at {address} has nodes of another job ({', '.join(foreign)}): "
                                      "two clusters merged; ports are derived from the job id, check for stray Ray")
            if len(ours) == expected:
                return sorted(n.get("NodeManagerHostname") or n.get("NodeManagerAddress", "?") for n in ours)
            if time.monotonic() > deadline:
                raise RayClusterError(f"only {len(ours)} of {expected} Ray nodes joined within {timeout_s:.0f} s; "
                                      "see ray-<job>-<node>.log in the run folder")
            time.sleep(POLL_S)
    finally:
        ray.shutdown()


TOKEN_FILE = "ray-token"


def token_file(run_dir: str) -> Path:
    """The run's Ray token, derived from the run's secret and written (0600, atomically; the same
    token on every incarnation) beside it; its path."""
    path = Path(run_dir) / TOKEN_FILE
    token = hmac.new(trust.run_secret(run_dir), b"ray-auth-token", hashlib.sha256).hexdigest()
    atomic_write_text(path, token, mode=0o600)
    return path


def run(spec: JsonObject) -> Any:
    """Wait for the whole Ray cluster, then run the driver script; its module-level `result` is returned.

    The stop signals interrupt the driver (slurmkit.worker.interrupt): on preemption or the time
    limit the job is requeued and the driver starts again in the new allocation.
    """
    nodes = wait_for_nodes(os.environ["RAY_ADDRESS"], os.environ["SLURMKIT_RAY_TAG"],
                           int(os.environ["SLURMKIT_RAY_NODES"]), float(spec.get("start_timeout_s", 120)))
    print(f"slurmkit ray: {len(nodes)} nodes joined at {os.environ['RAY_ADDRESS']}: {' '.join(nodes)}", flush=True)
    driver = spec["driver"]
    saved = sys.argv
    sys.argv = [driver, *spec.get("args", [])]
    try:
        namespace = runpy.run_path(driver, run_name="__main__")
    finally:
        sys.argv = saved
    return namespace.get("result")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "token":
        sys.exit("usage: python -P -m slurmkit.worker.ray_driver token RUN_DIR")
    print(token_file(sys.argv[2]))
