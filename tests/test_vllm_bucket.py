"""vLLM on an object-storage model path with ``--load-format aioloader``, as
``--load-format runai_streamer`` takes one: ``s3://`` (a loopback moto server),
``gs://`` (gcp-storage-emulator) and ``az://`` (Azurite), each holding the whole
all-MiniLM-L6-v2 folder. vLLM fetches the config and tokenizer into a local folder
through runai's streamer (its S3, GCS or Azure package), aioloader streams the
weights from the bucket. The embeddings must be bit-identical to vLLM's default
loader on the local folder; a missing bucket or container and a prefix without
weights fail naming what is missing."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .servers import MotoS3Server
from .test_vllm import TEXTS, VLLM_PYTHON, embeddings, model_folder, run_child, vllm_env

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no .venv-vllm (run scripts/vllm_setup.sh)"
)
BUCKET = "vllm-models"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[list[float]]:
    """vLLM's default loader on the local folder: the embeddings every run must match."""
    tmp = tmp_path_factory.mktemp("vllm-default")
    default = run_child(
        {"model": str(model_folder()), "texts": TEXTS,
         "runs": [{"name": "default", "load_format": "auto"}]},
        tmp,
    )  # fmt: skip
    return embeddings(default, "default")


def test_an_s3_model_path_streams_bit_identical(
    tmp_path: Path,
    moto_server: MotoS3Server,
    monkeypatch: pytest.MonkeyPatch,
    reference: list[list[float]],
) -> None:
    moto_server.upload(BUCKET, "minilm", model_folder())
    moto_server.set_env(monkeypatch, tmp_path)
    # vLLM's own fetch of the config (runai's streamer) addresses the bucket by path.
    monkeypatch.setenv("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    runs = [
        {"name": "s3", "load_format": "aioloader", "extra": {"concurrency": 4}},
        {"name": "cached", "load_format": "aioloader",
         "extra": {"cache_dir": str(tmp_path / "node-cache")}},
    ]  # fmt: skip
    results = run_child(
        {"model": f"s3://{BUCKET}/minilm", "texts": TEXTS, "runs": runs}, tmp_path, env=vllm_env()
    )
    for name in ("s3", "cached"):
        assert embeddings(results, name) == reference, name
        assert "aioloader: Loading weights took" in results[name]["log"]
    assert list((tmp_path / "node-cache" / "entries").glob("*/data"))


# -- gs:// and az:// ---------------------------------------------------------------------

Put = Callable[[str, bytes], object]  # stores one object of the bucket: (name, body)


def bucket_runs(put: Put, url: str, missing: str, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """Upload the model, then one vLLM child: ``url`` streamed, then through the node
    cache, then two bad paths.

    ``put(name, body)`` stores an object of the bucket; ``url`` is the bucket's
    ``minilm`` prefix, which gets the whole folder (the pooling config is in a
    subfolder) and ``minilm-config`` all of it but the weights; ``missing`` names
    a bucket or container that does not exist.
    """
    source = model_folder()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        name, body = path.relative_to(source).as_posix(), path.read_bytes()
        put(f"minilm/{name}", body)
        if path.suffix != ".safetensors":
            put(f"minilm-config/{name}", body)
    runs = [
        {"name": "stream", "load_format": "aioloader", "extra": {"concurrency": 4}},
        {"name": "cached", "load_format": "aioloader",
         "extra": {"cache_dir": str(tmp / "node-cache")}},
        {"name": "no-bucket", "load_format": "aioloader", "model": missing},
        {"name": "no-weights", "load_format": "aioloader", "model": url + "-config"},
    ]  # fmt: skip
    env = env | {"VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    return run_child({"model": url, "texts": TEXTS, "runs": runs}, tmp, env=env)


@contextlib.contextmanager
def gcs_bucket() -> Iterator[tuple[Put, dict[str, str]]]:
    from .gcs_server import GcsEmulator

    with GcsEmulator() as gcs:
        gcs.create_bucket(BUCKET)
        # runai's GCS client is google-cloud-storage, which STORAGE_EMULATOR_HOST points
        # at the emulator as it does aioloader's; it must not look for Google credentials.
        env = vllm_env() | {
            "STORAGE_EMULATOR_HOST": gcs.endpoint,
            "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1",
        }
        yield functools.partial(gcs.put, BUCKET), env


@contextlib.contextmanager
def azure_container() -> Iterator[tuple[Put, dict[str, str]]]:
    from .azure_server import AZURITE, AzuriteServer

    if not AZURITE.exists():
        pytest.skip("no Azurite (run scripts/azurite_setup.sh)")
    with AzuriteServer() as azurite:
        box = azurite.client().get_container_client(BUCKET)
        box.create_container()
        # Both runai's Azure client and aioloader's take the account from this string.
        env = {k: v for k, v in vllm_env().items() if not k.startswith("AZURE_STORAGE_")}
        yield box.upload_blob, env | {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}


# scheme -> (the store, a bucket or container it lacks, runai's package for the scheme)
STORES = {
    "gs": (gcs_bucket, "gs://no-such-bucket/minilm", "runai-model-streamer-gcs"),
    "az": (azure_container, "az://no-such-container/minilm", "runai-model-streamer-azure"),
}


@dataclass
class StoreRuns:
    scheme: str
    results: dict[str, Any]
    tmp: Path


@pytest.fixture(scope="module", params=sorted(STORES))
def store_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StoreRuns]:
    scheme = request.param
    store, missing, _ = STORES[scheme]
    tmp = tmp_path_factory.mktemp(f"vllm-{scheme}")
    with store() as (put, env):
        url = f"{scheme}://{BUCKET}/minilm"
        yield StoreRuns(scheme, bucket_runs(put, url, missing, tmp, env), tmp)


def test_a_gs_or_az_model_path_streams_bit_identical(
    store_runs: StoreRuns, reference: list[list[float]]
) -> None:
    results = store_runs.results
    for name in ("stream", "cached"):
        assert results[name]["ok"], results[name].get("traceback")
        assert embeddings(results, name) == reference, name
        assert "aioloader: Loading weights took" in results[name]["log"]
    assert list((store_runs.tmp / "node-cache" / "entries").glob("*/data"))


def test_a_gs_or_az_model_path_without_bucket_or_weights_fails_clearly(
    store_runs: StoreRuns,
) -> None:
    """vLLM's config fetch fails on the missing bucket (before any loader) with the
    plugin's note naming the path and runai's package; the loader on the prefix
    without weights, naming it."""
    _, model, package = STORES[store_runs.scheme]
    missing = store_runs.results["no-bucket"]
    assert not missing["ok"]
    assert f"config and tokenizer of {model} with runai's streamer" in missing["traceback"]
    assert f"pip install {package}" in missing["traceback"]
    empty = store_runs.results["no-weights"]
    assert not empty["ok"]
    url = f"{store_runs.scheme}://{BUCKET}/minilm-config"
    assert f"{url} holds no .safetensors files" in empty["error"]
