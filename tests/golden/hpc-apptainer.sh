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

# launch: the job's supervisor (slurmkit.supervisor.loop) runs the ranks from here on, one srun
# step per attempt, and asks the restart policy what comes next after a failure. Its plan:
#   launcher: srun, 4 rank(s) per node
#   health gate first: 4 GPU(s) per node
#   each attempt: one srun step of the ranks
#   after a failure the restart policy decides: 2 in-job restart(s) per incarnation; requeue budgets: crash 3, hang 3, node_failure 3, preemption 20, timeout 5
#   SIGUSR2 is passed to the ranks' step; the supervisor exits with the step's status
export SUBMITIT_EXECUTOR=slurm
export SLURMKIT_SIGNAL=USR2
export SLURMKIT_STARTUP_TIMEOUT_S=600.0
export SLURMKIT_STRAGGLER_SCORE=0.7
exec /opt/venv/bin/python -P -m slurmkit.supervisor --run-dir "$SLURMKIT_RUN_DIR" --plan '{"signal":"USR2","launcher":"srun","command":["/opt/venv/bin/python","-P","-u","-m","slurmkit.worker.rank","/shared/runs/golden-run/submitit"],"stdout":"/shared/runs/golden-run/submitit/%j_%t_log.out","stderr":"/shared/runs/golden-run/submitit/%j_%t_log.err","tasks_per_node":4,"in_job":2,"budgets":{"preemption":20,"timeout":5,"node_failure":3,"hang":3,"crash":3},"health":{"python":["/opt/venv/bin/python","-P"],"gpus":4,"allreduce":false}}' -- rank-prefix "${#SLURMKIT_RANK_PREFIX[@]}" "${SLURMKIT_RANK_PREFIX[@]}"
