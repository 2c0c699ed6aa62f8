#!/bin/sh
# The daemon's install steps, shared by deploy/Dockerfile and scripts/deploy_check.sh (which
# runs them outside Docker): a venv at $1 holding the wheel $2 with the daemon and uvloop
# extras, and no torch.
set -eu
venv=$1
wheel=$2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --no-cache-dir --quiet "$wheel[daemon,uvloop]"
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "install.sh: torch was installed; the daemon image must not carry it" >&2
    exit 1
fi
"$venv/bin/aioloader" --version
