"""vLLM without a local folder: ``LLM(model="org/name", load_format="aioloader")`` and
``vllm serve org/name --load-format aioloader`` against a local Hub serving the real
all-MiniLM-L6-v2 (tests/hub_server.py).

vLLM fetches the config and tokenizer through huggingface_hub (HF_ENDPOINT at the
local Hub, HF_HUB_OFFLINE unset, an empty HF_HOME); aioloader streams the weights
from the Hub's storage host in byte ranges. The embeddings must be bit-identical to
those of vLLM's default loader on the local folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .hub_server import LocalHub
from .test_vllm import (
    TEXTS,
    VLLM_PYTHON,
    embeddings,
    model_folder,
    run_child,
    serve_and_embed,
    vllm_env,
)

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no .venv-vllm (run scripts/vllm_setup.sh)"
)
REPO = "sentence-transformers/all-MiniLM-L6-v2"


def hub_env(hub: LocalHub, home: Path) -> dict[str, str]:
    """vLLM's environment, online against the local Hub, with an empty HF_HOME."""
    env = vllm_env()
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"):
        env.pop(name, None)
    home.mkdir(parents=True, exist_ok=True)
    return env | {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_TOKEN_PATH": str(home / "no")}


@pytest.fixture(scope="module")
def hub_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The default loader on the folder, then aioloader from the Hub by repository id."""
    tmp = tmp_path_factory.mktemp("vllm-hub")
    source = model_folder()
    files = {p.relative_to(source).as_posix(): p.read_bytes() for p in source.rglob("*")
             if p.is_file()}  # fmt: skip
    with LocalHub(tmp) as hub:
        hub.commit(REPO, files)
        default_run = {"name": "default", "load_format": "auto"}
        default = run_child({"model": str(source), "texts": TEXTS, "runs": [default_run]}, tmp)
        (tmp / "hub").mkdir()
        runs = [
            {"name": "hub", "load_format": "aioloader", "extra": {"concurrency": 4}},
            {"name": "hub-cached", "load_format": "aioloader",
             "extra": {"cache_dir": str(tmp / "node-cache")}},
        ]  # fmt: skip
        hub.storage.reset_counters()
        results = run_child(
            {"model": REPO, "texts": TEXTS, "runs": runs},
            tmp / "hub",
            env=hub_env(hub, tmp / "hf-home"),
        )
        yield {
            "results": default | results,
            "storage": hub.storage.request_headers,
            "log": hub.log,
            "hub": hub,
            "tmp": tmp,
        }


@pytest.mark.parametrize("name", ["hub", "hub-cached"])
def test_a_hub_repository_id_streams_bit_identical(hub_runs: dict[str, Any], name: str) -> None:
    results = hub_runs["results"]
    assert embeddings(results, name) == embeddings(results, "default")
    assert "aioloader: Loading weights took" in results[name]["log"]


def test_only_aioloader_read_the_weights(hub_runs: dict[str, Any]) -> None:
    # vLLM fetched config and tokenizer through the Hub; every byte of the weights
    # came from the storage host in ranges, aioloader's reads.
    storage = hub_runs["storage"]
    assert storage, "the weights were not read from the Hub's storage host"
    assert all("Range" in headers for headers in storage), storage
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub_runs["log"] if "/resolve/" in r.path}
    assert "config.json" in fetched and "tokenizer.json" in fetched, fetched


def test_the_node_cache_was_filled(hub_runs: dict[str, Any]) -> None:
    metas = [
        json.loads(p.read_text())
        for p in (hub_runs["tmp"] / "node-cache" / "entries").glob("*/meta.json")
    ]
    assert any(
        m["complete"]
        and m["url"].startswith(f"hf://{REPO}@")
        and m["url"].endswith("/model.safetensors")
        for m in metas
    ), metas


def test_vllm_serve_a_hub_repository_id(hub_runs: dict[str, Any]) -> None:
    tmp: Path = hub_runs["tmp"]
    log = tmp / "serve.log"
    served = serve_and_embed(REPO, [], log, env=hub_env(hub_runs["hub"], tmp / "serve-home"))
    expected = embeddings(hub_runs["results"], "default")[0]
    assert len(served) == len(expected)
    assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-5
    assert "aioloader: Loading weights took" in log.read_text()


_TRANSFORMERS = """
import sys, torch, transformers
repo, folder = sys.argv[1], sys.argv[2]
outputs = []
for where in (repo, folder):  # the cache aioloader wrote, offline; then the folder itself
    tokenizer = transformers.AutoTokenizer.from_pretrained(where)
    model = transformers.AutoModel.from_pretrained(where).eval()
    with torch.no_grad():
        batch = tokenizer(["a warm start from the cache"], return_tensors="pt")
        outputs.append(model(**batch).last_hidden_state)
assert torch.equal(outputs[0], outputs[1]), "the cached model computes otherwise"
print("same")
"""


def test_transformers_starts_offline_from_the_cache_aioloader_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import subprocess

    from aioloader import load_model, wait_hf_cache

    async def load_and_wait() -> None:
        await load_model(f"hf://{REPO}")
        await wait_hf_cache()

    source = model_folder()
    files = {p.relative_to(source).as_posix(): p.read_bytes() for p in source.rglob("*")
             if p.is_file()}  # fmt: skip
    cache = tmp_path / "hf-cache"
    with LocalHub(tmp_path) as hub:
        hub.commit(REPO, files)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        asyncio.run(load_and_wait())
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", _TRANSFORMERS, REPO, str(source)],
        env=vllm_env() | offline | {"HF_TOKEN_PATH": str(tmp_path / "no-token")},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-3000:]
