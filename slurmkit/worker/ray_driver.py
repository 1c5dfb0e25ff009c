"""The driver of a `ray:` run, called by submitit on the first node once the batch shell has started Ray.

The batch shell (templates/partials/ray.sh.j2) exports RAY_ADDRESS, SLURMKIT_RAY_NODES (how many
Ray nodes to expect) and SLURMKIT_RAY_TAG (a custom resource every node of this job carries). We
wait until exactly those nodes are alive, so a worker that joined another job's cluster (a port
clash) is an error rather than a silent merge, then run the driver script as __main__.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from typing import Any

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


def run(spec: dict[str, Any]) -> Any:
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
