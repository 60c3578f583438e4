#!/usr/bin/env bash
# Creates .venv and installs the project: torch's CPU wheel first (so nothing pulls the multi-GB
# CUDA build), then neptune_eq with its dev extra. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if ls /opt/wheels/torch-2.13.0* >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q torch==2.13.0          # the CPU wheel on disk (find-links)
  else
    .venv/bin/python -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
fi
.venv/bin/python -m pip install -q -e '.[dev]'
touch .venv/.installed
