#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels scripts/gpu_run.sh installs on a GPU machine
# without network (CPython 3.12, x86-64 manylinux) into .whl/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
         manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" --platform any -d .whl \
    "botocore==1.44.8" "jmespath==1.1.0" "runai-model-streamer==0.17.1" \
    "instanttensor==0.2.2" "fastsafetensors==0.5.0"
du -sh .whl
