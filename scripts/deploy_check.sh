#!/usr/bin/env bash
# Check deploy/ without a cluster or Docker (CI runs it, .ci/run):
# 1. every Kubernetes manifest, and the kustomize base as built (where kubectl is found),
#    validates with kubernetes-validate --strict against a current Kubernetes version
#    (.venv-deploy holds the tool); KServe's custom resources are checked by
#    tests/test_deploy.py instead, which parses them;
# 2. the Dockerfile's install step (deploy/install.sh) runs in a fresh venv with the wheel
#    of this checkout, and the image's entrypoint, `aioloader serve`, with a token made as
#    deploy/kubernetes/kustomization.yaml says, answers /health and /ready from there,
#    refuses /v1/models without the token and answers it with it, then stops on SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBERNETES_VERSION=${KUBERNETES_VERSION:-1.37.0}

PYTHON=${PYTHON:-python3}
if [ ! -x .venv-deploy/bin/kubernetes-validate ]; then
    "$PYTHON" -m venv .venv-deploy
    .venv-deploy/bin/python -m pip install --quiet "kubernetes-validate==1.37.0"
fi
manifests=()
for manifest in deploy/kubernetes/*.yaml; do
    [ "$manifest" = deploy/kubernetes/kustomization.yaml ] || manifests+=("$manifest")
done
.venv-deploy/bin/kubernetes-validate --strict --quiet -k "$KUBERNETES_VERSION" "${manifests[@]}"
scratch=$(mktemp -d)
daemon=
cleanup() {
    if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; fi
    rm -rf "$scratch"
}
trap cleanup EXIT
if command -v kubectl >/dev/null; then
    kubectl kustomize deploy/kubernetes >"$scratch/base.yaml"
    .venv-deploy/bin/kubernetes-validate --strict --quiet -k "$KUBERNETES_VERSION" "$scratch/base.yaml"
fi
echo "deploy_check: manifests valid for Kubernetes $KUBERNETES_VERSION"

# The wheel, as the Dockerfile's first stage builds it.
bash scripts/setup.sh
.venv/bin/python -m build --quiet --wheel --outdir "$scratch/dist" . >/dev/null
sh deploy/install.sh "$scratch/venv" "$scratch"/dist/aioloader-*-py3-none-any.whl
port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The token as the Secret's documented command makes it.
token=$(openssl rand -hex 32)
AIOLOADER_CACHE_DIR="$scratch/cache" AIOLOADER_TOKEN="$token" "$scratch/venv/bin/aioloader" \
    serve --host 127.0.0.1 --port "$port" >"$scratch/serve.log" 2>&1 &
daemon=$!
AIOLOADER_TOKEN="$token" "$scratch/venv/bin/python" - "$port" <<'PY'
import os, sys, time, urllib.error, urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 30
while True:
    try:
        for path in ("/health", "/ready"):
            with urllib.request.urlopen(base + path, timeout=2) as answer:
                assert answer.status == 200, (path, answer.status)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
try:
    urllib.request.urlopen(base + "/v1/models", timeout=5)
    raise AssertionError("/v1/models answered without the token")
except urllib.error.HTTPError as error:
    assert error.code == 401, error.code
bearer = {"Authorization": f"Bearer {os.environ['AIOLOADER_TOKEN']}"}
request = urllib.request.Request(base + "/v1/models", headers=bearer)
with urllib.request.urlopen(request, timeout=5) as answer:
    assert answer.status == 200, answer.status
PY
kill -TERM "$daemon"
status=0
wait "$daemon" || status=$?
daemon=
if [ "$status" -ne 0 ]; then
    cat "$scratch/serve.log" >&2
    echo "deploy_check: aioloader serve exited $status on SIGTERM" >&2
    exit 1
fi
echo "deploy_check: the image's install step and entrypoint work outside Docker"
