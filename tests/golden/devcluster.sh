#!/bin/bash
# Rendered by slurmkit; every value below is shell-quoted, so $ and ` in values stay literal.
# shellcheck disable=SC2016
#SBATCH --job-name=golden
#SBATCH --output=/shared/runs/golden-run/submitit/%j_0_log.out
#SBATCH --error=/shared/runs/golden-run/submitit/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=1000M
#SBATCH --time=00:10:00
#SBATCH --partition=debug
#SBATCH --signal=B:USR2@30
#SBATCH --requeue

set -uo pipefail
# Logs, outcomes and checkpoints are never world-readable (profile run_mode: private).
umask 0077

# setup
export OMP_NUM_THREADS=1
export SLURMKIT_RUN_NAME=golden
SLURMKIT_RUN_DIR=/shared/runs/golden-run



# Slurm signals the batch shell (USR2, 30 s before the limit, or on
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
# Each pass is one srun step of the ranks. After a crash or hang the requeue policy may start them
# again in this allocation (an in-job restart, exit 75) rather than requeue the job; exit status 0
# means every rank had finished its work before the failure (e.g. at exit).
export SLURMKIT_ATTEMPT=0
# Standby ranks (slurmkit.worker.standby): beside each step of the ranks, the next attempt's
# processes start and pay for their imports, so an in-job restart needs no fresh interpreters.
SLURMKIT_STANDBY_PID=""
SLURMKIT_TAKEN=""
slurmkit_standby_end() {
  if [ -n "$SLURMKIT_STANDBY_PID" ]; then
    kill "$SLURMKIT_STANDBY_PID" 2>/dev/null || true
    wait "$SLURMKIT_STANDBY_PID" 2>/dev/null || true
    SLURMKIT_STANDBY_PID=""
  fi
}
while true; do
  if [ -n "$SLURMKIT_TAKEN" ]; then
    # The standby step is the ranks now: the policy handed this attempt to it.
    SLURMKIT_LAUNCH_PID=$SLURMKIT_STANDBY_PID
    SLURMKIT_STANDBY_PID=""
  else
    slurmkit_standby_end
    srun --unbuffered --kill-on-bad-exit=1 --output=/shared/runs/golden-run/submitit/%j_%t_log.out --error=/shared/runs/golden-run/submitit/%j_%t_log.err /opt/venv/bin/python -P -u -m slurmkit.worker.rank /shared/runs/golden-run/submitit &
    SLURMKIT_LAUNCH_PID=$!
  fi
  srun --overlap --unbuffered --kill-on-bad-exit=1 --output=/shared/runs/golden-run/submitit/%j_%t_log.out --error=/shared/runs/golden-run/submitit/%j_%t_log.err /opt/venv/bin/python -P -u -m slurmkit.worker.standby --run-dir "$SLURMKIT_RUN_DIR" /shared/runs/golden-run/submitit --attempt "$(( SLURMKIT_ATTEMPT + 1 ))" &
  SLURMKIT_STANDBY_PID=$!
# wait returns early (status > 128) when the trap runs; keep waiting until srun itself exits.
while true; do
  wait "$SLURMKIT_LAUNCH_PID"
  SLURMKIT_RC=$?
  kill -0 "$SLURMKIT_LAUNCH_PID" 2>/dev/null || break
done
  if [ "$SLURMKIT_RC" -eq 0 ]; then
    break
  fi
  SLURMKIT_TAKEN=""
  if kill -0 "$SLURMKIT_STANDBY_PID" 2>/dev/null; then
    SLURMKIT_TAKEN=1
  fi
  /opt/venv/bin/python -P -m slurmkit.worker.requeue --run-dir "$SLURMKIT_RUN_DIR" --exit-code "$SLURMKIT_RC" ${SLURMKIT_TAKEN:+--standby} >/dev/null
  SLURMKIT_DECISION=$?
  if [ "$SLURMKIT_DECISION" -eq 0 ]; then
    SLURMKIT_RC=0
  fi
  if [ "$SLURMKIT_DECISION" -ne 75 ]; then
    break
  fi
  SLURMKIT_ATTEMPT=$(( SLURMKIT_ATTEMPT + 1 ))
done
SLURMKIT_TAKEN=""
slurmkit_standby_end
exit "$SLURMKIT_RC"
