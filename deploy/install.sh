#!/bin/sh
# The daemon's install steps, shared by deploy/Dockerfile and scripts/deploy_check.sh (which
# runs them outside Docker): a venv at $1 holding the wheel $2 with the extras below, and no
# torch. The image serves every scheme the daemon accepts and deploy/kserve/ routes to it:
# http(s):// and s3:// need no extra, hf:// needs hf, gs:// gcs, az:// (and Azure's
# https://<account>.blob.core.windows.net URLs) azure (tests/test_deploy.py checks the list).
set -eu
venv=$1
wheel=$2
# swarm: libtorrent, which the daemon needs with AIOLOADER_PEERS (the DaemonSet sets it).
extras=daemon,uvloop,hf,gcs,azure,swarm
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --no-cache-dir --quiet "$wheel[$extras]"
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "install.sh: torch was installed; the daemon image must not carry it" >&2
    exit 1
fi
# The stores' clients, as the sources import them: a missing one fails the build, not a load.
"$venv/bin/python" -c "import prometheus_client, uvloop, huggingface_hub, google.auth, \
google.auth.transport.requests, azure.storage.blob, azure.identity" || {
    echo "install.sh: a store's client is missing from $venv (extras $extras)" >&2
    exit 1
}
"$venv/bin/aioloader" --version
