# A two-program RL loop for a heterogeneous job (docs/heterogeneous.md): a trainer that
# asks rollout workers for samples over TCP each step, and the rollout workers serving them. Each
# part is its own torch.distributed world; the trainer finds the rollout's first node by
# SLURMKIT_ROLLOUT_HOST. The trainer uses slurmkit.Checkpoint (preempted, it stops at an agreed step,
# saves, and the requeued job goes on from there); the rollout workers keep no state.
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist

import slurmkit


def port() -> int:
    # The rollout's own port, which the trainer computes too (the job id is the same in every part;
    # on the local profile it is the local run's, SUBMITIT_LOCAL_JOB_ID).
    return 31000 + int(os.environ.get("SLURM_JOB_ID") or os.environ["SUBMITIT_LOCAL_JOB_ID"]) % 1000


def rollout(crash_once: str | None) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rollout rank={rank} world={world} port={os.environ['MASTER_PORT']}", flush=True)
    if crash_once and rank == 1 and not os.path.exists(crash_once):
        open(crash_once, "w").close()
        time.sleep(2)  # after the trainer has had its first samples
        print("rollout rank=1 crashing", flush=True)
        os._exit(3)
    if rank != 0:
        while True:  # a worker of the part; rank 0 alone serves
            time.sleep(1)
    server = socket.create_server(("", port()))
    attempt = os.environ.get("SLURMKIT_ATTEMPT", "0")
    while True:
        conn, _ = server.accept()
        with conn:
            step = conn.recv(64).decode()
            conn.sendall(f"sample step={step} from={socket.gethostname()} world={world} attempt={attempt}".encode())


def ask(host: str, step: int, ckpt: slurmkit.Checkpoint) -> str:
    while True:  # the rollout part may be starting, or restarting after a crash
        if ckpt.stop_requested:  # the run is stopping (its rollout too): on to the step's agreed stop
            return "no sample: stopping"
        try:
            with socket.create_connection((host, port()), timeout=10) as conn:
                conn.sendall(str(step).encode())
                reply = conn.recv(256).decode()
                if reply:
                    return reply
        except OSError:
            pass
        time.sleep(0.2)


def trainer(steps: int, step_time: float) -> None:
    dist.init_process_group("gloo")
    parts = slurmkit.components()
    host = parts["rollout"].host
    assert host == os.environ["SLURMKIT_ROLLOUT_HOST"]
    print(f"trainer rank={dist.get_rank()} world={dist.get_world_size()} on={socket.gethostname()} "
          f"port={os.environ['MASTER_PORT']} rollout={host} mine={[n for n, c in parts.items() if c.mine]}",
          flush=True)
    weight = torch.zeros(1)
    ckpt = slurmkit.Checkpoint(every=10)
    state, start = ckpt.restore(), 0
    if state is not None:
        weight, start = state["weight"], state["step"]
        print(f"trainer resumed at step={start}", flush=True)
    for i in range(start, steps):
        reply = ask(host, i + 1, ckpt)
        weight += 1
        print(f"trainer step={i + 1} {reply}", flush=True)
        time.sleep(step_time)
        ckpt.step(i + 1, {"weight": weight, "step": i + 1})
    print(f"trainer done weight={weight.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["trainer", "rollout"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--crash-once", default=None)
    args = parser.parse_args()
    if args.role == "trainer":
        trainer(args.steps, args.step_time)
    else:
        rollout(args.crash_once)
