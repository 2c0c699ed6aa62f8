#!/usr/bin/env bash
# The whole GPU check as one command, for a machine with an NVIDIA GPU and no network:
#
#   OUT=/path/for/results bash scripts/gpu_run.sh [extra gpu_check.py arguments]
#
# Installs the wheels in .whl/ (botocore and its pure-Python needs, runai-model-streamer,
# InstantTensor, fastsafetensors: fetch them with scripts/gpu_wheels.sh on a machine with
# PyPI) into a site folder, puts a ~20 GB Llama-shaped model in RAM (a tmpfs), runs
# scripts/gpu_check.py unbuffered and leaves its table and log in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/aioloader-gpu-out}
mkdir -p "$OUT"
SITE=/tmp/aioloader-site
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || exit 1
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# A tmpfs of our own where we may mount one (/dev/shm is sized from the RAM seen at boot).
DATA=/mnt/aioloader-gpu
mkdir -p "$DATA"
if ! mountpoint -q "$DATA"; then
    mount -t tmpfs -o size=48g tmpfs "$DATA" 2>/dev/null || DATA=/dev/shm/aioloader-gpu
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
        --format=csv,noheader 2>&1
    python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])'
    grep -E "MemTotal|MemAvailable" /proc/meminfo
    df -h "$DATA" | tail -1
} 2>&1 | tee "$OUT/machine.txt"
python3 scripts/gpu_check.py --dir "$DATA" --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
