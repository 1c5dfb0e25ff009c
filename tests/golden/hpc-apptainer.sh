#!/bin/bash
# Rendered by slurmkit; every value below is shell-quoted, so $ and ` in values stay literal.
# shellcheck disable=SC2016
#SBATCH --job-name=golden
#SBATCH --output=/shared/runs/golden-run/submitit/%j_0_log.out
#SBATCH --error=/shared/runs/golden-run/submitit/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=4
#SBATCH --mem=256G
#SBATCH --time=1-00:00:00
#SBATCH --partition=gpu_a100
#SBATCH --account=proj-1234
#SBATCH --reservation=ml-week
#SBATCH --signal=B:USR2@180
#SBATCH --requeue

set -uo pipefail
# Logs, outcomes and checkpoints are never world-readable (profile run_mode: private).
umask 0077

# setup
module load cuda/12.4
module load apptainer/1.3
export HF_HOME="/scratch/$USER/hf-cache"
export SLURMKIT_RUN_NAME=golden
SLURMKIT_RUN_DIR=/shared/runs/golden-run

# NCCL
export NCCL_SOCKET_IFNAME=ib0

# container: apptainer; the run folder, run_root and a local checkpoint root are always mounted.
SLURMKIT_CONTAINER_IMAGE=/projects/proj-1234/images/pytorch-24.05.sif
export SLURMKIT_CONTAINER_IMAGE
# apptainer: the host environment (SLURM_*, NCCL_*, slurmkit's) passes through; /dev (InfiniBand) is shared.
# shellcheck disable=SC2054  # the commas belong to single options
SLURMKIT_RANK_PREFIX=(apptainer exec --nv --bind /scratch:/scratch,/scratch/alice/slurmkit-runs:/scratch/alice/slurmkit-runs,/shared/runs/golden-run:/shared/runs/golden-run --pwd /scratch /projects/proj-1234/images/pytorch-24.05.sif)

# Slurm signals the batch shell (USR2, 180 s before the limit, or on
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
if ! srun --ntasks-per-node=1 -n "$SLURM_JOB_NUM_NODES" -c 1 --kill-on-bad-exit=0 /opt/venv/bin/python -P -m slurmkit.worker.health --run-dir "$SLURMKIT_RUN_DIR" --gpus 4; then
  # Requeued with the failing nodes excluded (cause node_failure), within the profile's budget.
  /opt/venv/bin/python -P -m slurmkit.worker.requeue --run-dir "$SLURMKIT_RUN_DIR" --health
  exit 1
fi
# Each pass is one srun step of the ranks. After a crash or hang the requeue policy may start them
# again in this allocation (an in-job restart, exit 75) rather than requeue the job; exit status 0
# means every rank had finished its work before the failure (e.g. at exit).
export SLURMKIT_ATTEMPT=0
while true; do
  srun --unbuffered --kill-on-bad-exit=1 --output=/shared/runs/golden-run/submitit/%j_%t_log.out --error=/shared/runs/golden-run/submitit/%j_%t_log.err "${SLURMKIT_RANK_PREFIX[@]}" /opt/venv/bin/python -P -u -m slurmkit.worker.rank /shared/runs/golden-run/submitit &
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
