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
SLURMKIT_CONTAINER_IMAGE=/lustre/images/pytorch-slurmkit-25.01.sqsh
export SLURMKIT_CONTAINER_IMAGE
# pyxis/enroot: srun options; --container-env makes these host values win over the image's.
# shellcheck disable=SC2054  # the commas belong to single options
SLURMKIT_SRUN_CONTAINER=(--container-image=/lustre/images/pytorch-slurmkit-25.01.sqsh --container-mounts=/lustre/datasets:/data:ro,/lustre/checkpoints:/checkpoints,/lustre/scratch/alice/slurmkit-runs:/lustre/scratch/alice/slurmkit-runs,/shared/runs/golden-run:/shared/runs/golden-run,/lustre/checkpoints/alice:/lustre/checkpoints/alice --container-workdir=/workspace --container-env=NCCL_SOCKET_IFNAME,NCCL_IB_HCA,NCCL_IB_GID_INDEX,NCCL_NET_GDR_LEVEL,NCCL_DEBUG)

# launch: the job's supervisor (slurmkit.supervisor.loop) runs the ranks from here on, one srun
# step per attempt, and asks the restart policy what comes next after a failure. Its plan:
#   launcher: srun, 8 rank(s) per node
#   health gate first: 8 GPU(s) per node
#   each attempt: one srun step of the ranks
#   after a failure the restart policy decides: 2 in-job restart(s) per incarnation; requeue budgets: crash 3, hang 3, node_failure 5, preemption 50, timeout 10
#   SIGUSR2 is passed to the ranks' step; the supervisor exits with the step's status
export SUBMITIT_EXECUTOR=slurm
export SLURMKIT_SIGNAL=USR2
export SLURMKIT_STARTUP_TIMEOUT_S=600.0
export SLURMKIT_STRAGGLER_SCORE=0.7
exec /opt/venv/bin/python -P -m slurmkit.supervisor --run-dir "$SLURMKIT_RUN_DIR" --plan '{"signal":"USR2","launcher":"srun","command":["/usr/bin/python","-P","-u","-m","slurmkit.worker.rank","/shared/runs/golden-run/submitit"],"stdout":"/shared/runs/golden-run/submitit/%j_%t_log.out","stderr":"/shared/runs/golden-run/submitit/%j_%t_log.err","tasks_per_node":8,"in_job":2,"budgets":{"preemption":50,"timeout":10,"node_failure":5,"hang":3,"crash":3},"health":{"python":["/opt/venv/bin/python","-P"],"gpus":8,"allreduce":false}}' -- srun-options "${#SLURMKIT_SRUN_CONTAINER[@]}" "${SLURMKIT_SRUN_CONTAINER[@]}"
