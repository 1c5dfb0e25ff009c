#!/bin/bash
# Rendered by slurmkit; every value below is shell-quoted, so $ and ` in values stay literal.
# shellcheck disable=SC2016
#SBATCH --job-name=golden
#SBATCH --output=/shared/runs/golden-run/submitit/%j_0_log.out
#SBATCH --error=/shared/runs/golden-run/submitit/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --signal=B:USR2@120
#SBATCH --requeue

set -uo pipefail
# Logs, outcomes and checkpoints are never world-readable (profile run_mode: private).
umask 0077

# setup
export SLURMKIT_RUN_NAME=golden
SLURMKIT_RUN_DIR=/shared/runs/golden-run



# launch: the job's supervisor (slurmkit.supervisor.loop) runs the ranks from here on, one srun
# step per attempt, and asks the restart policy what comes next after a failure. Its plan:
#   launcher: srun, 2 rank(s) per node
#   each attempt: one srun step of the ranks; beside it a standby step that takes the next attempt
#   after a failure the restart policy decides: 2 in-job restart(s) per incarnation; requeue budgets: crash 3, hang 3, node_failure 3, preemption 20, timeout 5
#   SIGUSR2 is passed to the ranks' step; the supervisor exits with the step's status
export SUBMITIT_EXECUTOR=slurm
export SLURMKIT_SIGNAL=USR2
export SLURMKIT_STARTUP_TIMEOUT_S=600.0
export SLURMKIT_STRAGGLER_SCORE=0.7
exec /opt/venv/bin/python -P -m slurmkit.supervisor --run-dir "$SLURMKIT_RUN_DIR" --plan '{"signal":"USR2","launcher":"srun","command":["/opt/venv/bin/python","-P","-u","-m","slurmkit.worker.rank","/shared/runs/golden-run/submitit"],"stdout":"/shared/runs/golden-run/submitit/%j_%t_log.out","stderr":"/shared/runs/golden-run/submitit/%j_%t_log.err","tasks_per_node":2,"in_job":2,"budgets":{"preemption":20,"timeout":5,"node_failure":3,"hang":3,"crash":3},"standby":["/opt/venv/bin/python","-P","-u","-m","slurmkit.worker.standby","/shared/runs/golden-run/submitit"]}'
