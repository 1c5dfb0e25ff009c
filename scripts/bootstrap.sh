#!/usr/bin/env bash
# Create .venv and install slurmkit into it. Idempotent; used by both README commands.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
FIND_LINKS=()
[ -d /opt/wheels ] && FIND_LINKS=(--find-links /opt/wheels)
# torch first and pinned: a CPU build lies on disk, and an unpinned install would fetch a CUDA build.
# A torch that imports is not enough: it must be the CPU build pinned here (another version could be
# a CUDA build, or outside the project's range).
if [ "$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null)" != "2.13.0" ]; then
  .venv/bin/pip install -q "${FIND_LINKS[@]}" "torch==2.13.0"
fi
.venv/bin/pip install -q "${FIND_LINKS[@]}" -e ".[${1:-test}]"
