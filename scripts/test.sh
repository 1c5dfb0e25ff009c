#!/usr/bin/env bash
# Set everything up and run the whole test suite against a real Slurm cluster on this machine:
# Debian's slurm + munge + mariadb, the Python environment, a 2-node dev cluster, lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && ! command -v slurmctld >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd \
    mariadb-server iproute2 procps util-linux >/dev/null
fi
bash scripts/bootstrap.sh test
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check slurmkit tests benchmarks
echo "== mypy"; mypy
if [ "$(id -u)" = 0 ]; then
  echo "== dev cluster"; slurmkit devcluster up --nodes 2 --purge
else
  echo "!! not root: the dev cluster cannot start; cluster tests will be SKIPPED" >&2
fi
echo "== pytest"
python -m pytest "$@"
