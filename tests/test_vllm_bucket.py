"""vLLM on an ``s3://`` model path with ``--load-format aioloader``, as
``--load-format runai_streamer`` takes one: vLLM fetches the config and tokenizer
into a local folder, aioloader streams the weights from the bucket (a loopback moto
server holding the whole all-MiniLM-L6-v2 folder). The embeddings must be
bit-identical to vLLM's default loader on the local folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from .servers import MotoS3Server
from .test_vllm import TEXTS, VLLM_PYTHON, embeddings, model_folder, run_child, vllm_env

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no .venv-vllm (run scripts/vllm_setup.sh)"
)
BUCKET = "vllm-models"


def test_an_s3_model_path_streams_bit_identical(
    tmp_path: Path, moto_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = model_folder()
    moto_server.upload(BUCKET, "minilm", source)
    moto_server.set_env(monkeypatch, tmp_path)
    # vLLM's own fetch of the config (runai's streamer) addresses the bucket by path.
    monkeypatch.setenv("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    default = run_child(
        {"model": str(source), "texts": TEXTS,
         "runs": [{"name": "default", "load_format": "auto"}]},
        tmp_path,
    )  # fmt: skip
    (tmp_path / "s3").mkdir()
    runs = [
        {"name": "s3", "load_format": "aioloader", "extra": {"concurrency": 4}},
        {"name": "cached", "load_format": "aioloader",
         "extra": {"cache_dir": str(tmp_path / "node-cache")}},
    ]  # fmt: skip
    results = run_child(
        {"model": f"s3://{BUCKET}/minilm", "texts": TEXTS, "runs": runs},
        tmp_path / "s3",
        env=vllm_env(),
    )
    for name in ("s3", "cached"):
        assert embeddings(results, name) == embeddings(default, "default"), name
        assert "aioloader: Loading weights took" in results[name]["log"]
    assert list((tmp_path / "node-cache" / "entries").glob("*/data"))
