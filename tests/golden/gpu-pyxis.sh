#!/bin/bash
# Rendered by slurmkit; every value below is shell-quoted, so $ and ` in values stay literal.
# shellcheck disable=SC2016
#SBATCH --job-name=golden
#SBATCH --output=/shared/runs/golden-run/submitit/%j_0_log.out
#SBATCH --error=/shared/runs/golden-run/submitit/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --gpus-per-node=8
#SBATCH --mem=0
#SBATCH --time=04:00:00
#SBATCH --partition=gpu
#SBATCH --account=ml-research
#SBATCH --qos=normal
#SBATCH --constraint=h100
#SBATCH --exclude=gpu-node-017
#SBATCH --signal=B:USR2@300
#SBATCH --requeue
#SBATCH --exclusive
#SBATCH --mail-type=FAIL

set -uo pipefail
# Logs, outcomes and checkpoints are never world-readable (profile run_mode: private).
umask 0077

# setup
export SLURMKIT_RUN_NAME=golden
SLURMKIT_RUN_DIR=/shared/runs/golden-run

# NCCL
export NCCL_SOCKET_IFNAME='^lo,docker0'
export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
export NCCL_IB_GID_INDEX=3
export NCCL_NET_GDR_LEVEL=PHB
export NCCL_DEBUG=WARN

# container: pyxis; the run folder, run_root and a local checkpoint root are always mounted.
SLURMKIT_CONTAINER_IMAGE='nvcr.io#nvidia/pytorch:24.05-py3'
export SLURMKIT_CONTAINER_IMAGE
# pyxis/enroot: srun options; --container-env makes these host values win over the image's.
# shellcheck disable=SC2054  # the commas belong to single options
SLURMKIT_SRUN_CONTAINER=(--container-image='nvcr.io#nvidia/pytorch:24.05-py3' --container-mounts=/lustre/datasets:/data:ro,/lustre/checkpoints:/checkpoints,/lustre/scratch/alice/slurmkit-runs:/lustre/scratch/alice/slurmkit-runs,/shared/runs/golden-run:/shared/runs/golden-run,/lustre/checkpoints/alice:/lustre/checkpoints/alice --container-workdir=/workspace --container-env=NCCL_SOCKET_IFNAME,NCCL_IB_HCA,NCCL_IB_GID_INDEX,NCCL_NET_GDR_LEVEL,NCCL_DEBUG)

# Slurm signals the batch shell (USR2, 300 s before the limit, or on
# preemption). The trap forwards it to the ranks and the shell keeps waiting, so the ranks can
# agree on a step, save and requeue before the job ends.
SLURMKIT_LAUNCH_PID=""
# shellcheck disable=SC2329  # invoked by the trap below
slurmkit_forward_signal() {
  echo "slurmkit: caught SIGUSR2, forwarding to ranks" >&2
  if [ -n "$SLURMKIT_LAUNCH_PID" ]; then
    kill -USR2 "$SLURMKIT_LAUNCH_PID" 2>/dev/null || true
  fi
}
trap slurmkit_forward_signal USR2

# launch: one rank per task; one rank exiting non-zero (a crash, the hang watchdog) stops them all.
export SUBMITIT_EXECUTOR=slurm
export SLURMKIT_SIGNAL=USR2
# Health gate, one check per node before any rank starts: GPUs as requested, no uncorrectable ECC.
if ! srun --ntasks-per-node=1 -n "$SLURM_JOB_NUM_NODES" -c 1 --kill-on-bad-exit=0 /opt/venv/bin/python -P -m slurmkit.worker.health --run-dir "$SLURMKIT_RUN_DIR" --gpus 8; then
  # Requeued with the failing nodes excluded (cause node_failure), within the profile's budget.
  /opt/venv/bin/python -P -m slurmkit.worker.requeue --run-dir "$SLURMKIT_RUN_DIR" --health
  exit 1
fi
# Each pass is one srun step of the ranks. After a crash or hang the requeue policy may start them
# again in this allocation (an in-job restart, exit 75) rather than requeue the job; exit status 0
# means every rank had finished its work before the failure (e.g. at exit).
export SLURMKIT_ATTEMPT=0
while true; do
  srun --unbuffered --kill-on-bad-exit=1 --output=/shared/runs/golden-run/submitit/%j_%t_log.out --error=/shared/runs/golden-run/submitit/%j_%t_log.err "${SLURMKIT_SRUN_CONTAINER[@]}" /usr/bin/python -P -u -m slurmkit.worker.rank /shared/runs/golden-run/submitit &
  SLURMKIT_LAUNCH_PID=$!
# wait returns early (status > 128) when the trap runs; keep waiting until srun itself exits.
while true; do
  wait "$SLURMKIT_LAUNCH_PID"
  SLURMKIT_RC=$?
  kill -0 "$SLURMKIT_LAUNCH_PID" 2>/dev/null || break
done
  if [ "$SLURMKIT_RC" -eq 0 ]; then
    break
  fi
  /opt/venv/bin/python -P -m slurmkit.worker.requeue --run-dir "$SLURMKIT_RUN_DIR" --exit-code "$SLURMKIT_RC" >/dev/null
  SLURMKIT_DECISION=$?
  if [ "$SLURMKIT_DECISION" -eq 0 ]; then
    SLURMKIT_RC=0
  fi
  if [ "$SLURMKIT_DECISION" -ne 75 ]; then
    break
  fi
  SLURMKIT_ATTEMPT=$(( SLURMKIT_ATTEMPT + 1 ))
done
exit "$SLURMKIT_RC"
