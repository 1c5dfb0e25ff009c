#!/usr/bin/env bash
# Set everything up and run the whole test suite against a real Slurm cluster on this machine:
# Debian's slurm + munge + mariadb, the Python environment, a 2-node dev cluster, lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# tmux: the tests type into `slurmkit attach` through a real terminal; chromium: the HTML report is
# loaded in a real headless browser (tests/unit/test_report_browser.py); squashfs-tools: pyxis images are
# squashfs files, listed at submit (tests/unit/test_containers.py).
if [ "$(id -u)" = 0 ] && ! { command -v slurmctld && command -v tmux && command -v chromium && command -v mksquashfs; } >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd \
    mariadb-server iproute2 procps util-linux tmux openssh-server chromium squashfs-tools >/dev/null
fi
bash scripts/bootstrap.sh test
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff (at ${SECONDS} s)"; ruff check slurmkit tests benchmarks
# mypy (a minute or two of one core, cold) checks beside the cluster's start and the tests, which
# leave a core idle a third of the time; its verdict counts with theirs at the end.
mypy_log=$(mktemp)
nice -n 5 mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
if [ "$(id -u)" = 0 ]; then
  echo "== dev cluster (at ${SECONDS} s)"; slurmkit devcluster up --nodes 2 --purge
else
  echo "!! not root: the dev cluster cannot start; cluster tests will be SKIPPED" >&2
fi
mypy_rc() { local rc=0; wait "$mypy_pid" || rc=$?; echo "== mypy"; cat "$mypy_log"; rm -f "$mypy_log"; return $rc; }
echo "== pytest (at ${SECONDS} s)"
if [ $# -gt 0 ]; then
  mypy_rc
  exec python -m pytest "$@"
fi
# The cluster tests share the one dev cluster and mostly wait on Slurm: the other tests run beside
# them in a second pytest, whose output follows theirs.
rest_log=$(mktemp)
# The machine's busy and total CPU ticks (/proc/stat): how much of the CPUs the suite kept busy.
cpu_ticks() { awk '/^cpu / {busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6}' /proc/stat; }
read -r busy0 total0 < <(cpu_ticks)
# A background command of a script starts with SIGINT and SIGQUIT ignored, and so would every
# process the tests start (a local run's cancel is a SIGINT): env gives them their defaults back.
# niced (10: about a tenth of a contended core): the cluster tests are the longer half, and they wait on
# their jobs' CPU time; these fill the cores the cluster tests leave idle while they wait on Slurm.
nice -n 10 env --default-signal=INT,QUIT python -m pytest -m "not cluster" -p no:cacheprovider >"$rest_log" 2>&1 &
rest=$!
cluster_rc=0
python -m pytest -m cluster || cluster_rc=$?
rest_rc=0
wait "$rest" || rest_rc=$?
read -r busy1 total1 < <(cpu_ticks)
echo "== pytest: the tests without the cluster (run beside the cluster tests)"
cat "$rest_log"
rm -f "$rest_log"
echo "== pytest: the CPUs were busy $((100 * (busy1 - busy0) / (total1 - total0 + 1)))% of the time"
types_rc=0
mypy_rc || types_rc=$?
echo "== done (at ${SECONDS} s)"
exit $((cluster_rc || rest_rc || types_rc))
