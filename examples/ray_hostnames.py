"""A Ray driver: run tasks pinned to every node of the cluster and print the hostnames they ran on."""

import socket
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init()  # RAY_ADDRESS, set by slurmkit, names this job's own cluster


@ray.remote(num_cpus=1)
def where() -> str:
    time.sleep(0.2)
    return socket.gethostname()


nodes = [n for n in ray.nodes() if n["Alive"]]
# Zero-length tasks all land on the head even with SPREAD: pin two to each node instead.
refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in nodes for _ in range(2)]
hostnames = sorted(set(ray.get(refs)))
print("ray hostnames:", " ".join(hostnames), flush=True)
result = {"hostnames": hostnames, "nodes": len(nodes)}
