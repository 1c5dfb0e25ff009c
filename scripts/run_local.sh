#!/usr/bin/env bash
# Set everything up and run the main job: data-parallel training of the digits classifier,
# 2 ranks (gloo) on the embedded `local` profile. No Slurm needed. Prints accuracy and throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
exec .venv/bin/slurmkit submit examples/train_digits.yaml -p local --wait "$@"
