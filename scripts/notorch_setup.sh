#!/usr/bin/env bash
# Create .venv-notorch: this package with only the daemon extra, and no torch, for
# tests/test_torch_free.py (the daemon, the node cache and numpy loads run without torch).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-notorch
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
# Editable: the test checks the code of this checkout, not a copy made when the venv was.
python -m pip install --quiet -e ".[daemon]"
if python -c "import torch" >/dev/null 2>&1; then
    echo "$VENV holds torch: something in aioloader[daemon] pulls it in" >&2
    exit 1
fi
echo "$VENV ready: aioloader $(python -c 'import aioloader; print(aioloader.__version__)'), no torch"
