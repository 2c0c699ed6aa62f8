#!/usr/bin/env bash
# Create .venv-ray: Ray, this package with its swarm extra (libtorrent, through which
# preload's nodes share one download) and its test dependencies, for tests/test_ray*.py
# and scripts/ray_bench.py. Its own venv: Ray pins versions of its own. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-ray
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
# torch pinned: 2.13.0 is the CPU build these machines carry on disk.
python -m pip install --quiet "ray==2.60.0" "torch==2.13.0" -e ".[test,swarm]"
echo "$VENV ready: $(python -c 'import ray, libtorrent; print("ray", ray.__version__, "libtorrent", libtorrent.__version__)')"
