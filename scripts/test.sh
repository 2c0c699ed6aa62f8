#!/usr/bin/env bash
# Set up, then run the whole test suite (extra arguments go to pytest).
# The Ray tests run in .venv-ray when it exists (scripts/ray_setup.sh; CI makes it);
# the vLLM tests use .venv-vllm the same way (scripts/vllm_setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ray_setup_rc=${CI_RAY_SETUP_RC:-}  # see below; kept out of the tests' environment
unset CI_RAY_SETUP_RC
bash scripts/setup.sh
. .venv/bin/activate
# Two workers by default (AIOLOADER_TEST_WORKERS=0: one process, as before).
python -m pytest -n "${AIOLOADER_TEST_WORKERS:-2}" --dist worksteal "$@"
# .ci/run makes .venv-ray while the suite above runs, and names the file its exit status
# goes to: wait for it, and show its log if it failed.
if [ -n "$ray_setup_rc" ]; then
    while [ ! -s "$ray_setup_rc" ]; do sleep 1; done
    if [ "$(cat "$ray_setup_rc")" != 0 ]; then
        cat "${ray_setup_rc%.rc}.log" >&2
        echo "scripts/ray_setup.sh failed (its output above)" >&2
        exit 1
    fi
fi
if [ -x .venv-ray/bin/python ]; then
    .venv-ray/bin/python -m pytest -p no:cacheprovider tests/test_ray.py "$@"
fi
