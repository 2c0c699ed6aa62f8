#!/usr/bin/env bash
# Install Azurite (Microsoft's Azure Storage emulator) into .azurite/ for tests/test_azure.py.
# 3.35.0 is the last release that runs on node 20; 3.36+ needs node 22. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .azurite/node_modules/.bin/azurite-blob ]; then
    exit 0
fi
if ! command -v npm >/dev/null; then
    echo "npm not found: the Azure tests will be skipped (install node 20 and npm)" >&2
    exit 0
fi
npm install --silent --no-audit --no-fund --prefix .azurite azurite@3.35.0
echo ".azurite ready: $(.azurite/node_modules/.bin/azurite-blob --version)"
