"""``gs://`` against gcp-storage-emulator on 127.0.0.1 (see tests/gcs_server.py).

``STORAGE_EMULATOR_HOST`` points the source at it, as it does Google's own
client libraries; every tensor is compared bit for bit with safetensors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aioloader import ConfigError, ModelCache, NotFoundError, load_model
from aioloader.runtime.threads import Lane
from aioloader.sources.gcs.signer import GcsSigner, _find

from .helpers import assert_matches_files, random_tensors, some_big, write_file, write_sharded
from .servers import GcsEmulator

pytest.importorskip("gcp_storage_emulator")


async def test_a_prefix_an_index_and_one_object_load_bit_for_bit(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    index = write_sharded(tmp_path / "m", some_big(1), shards=3)
    shards = sorted(index.parent.glob("*.safetensors"))
    gcs.upload("models", "llm", tmp_path / "m")
    assert_matches_files(await load_model("gs://models/llm/", chunk_size="256KiB"), *shards)
    got = await load_model("gs://models/llm/model.safetensors.index.json", concurrency=3)
    assert_matches_files(got, *shards)
    one = write_file(tmp_path / "one" / "model.safetensors", some_big(2))
    gcs.upload("models", "one", tmp_path / "one")
    assert_matches_files(await load_model("gs://models/one/model.safetensors"), one)


async def test_a_missing_object_or_bucket_is_named(gcs: GcsEmulator, tmp_path: Path) -> None:
    write_file(tmp_path / "m" / "model.safetensors", random_tensors())
    gcs.upload("present", "m", tmp_path / "m")
    with pytest.raises(NotFoundError, match=r"gs://present/m/nothing\.safetensors does not exist"):
        await load_model("gs://present/m/nothing.safetensors")
    with pytest.raises(NotFoundError, match="bucket 'absent' does not exist"):
        await load_model("gs://absent/m/")


async def test_through_the_node_cache_keyed_on_the_generation(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    path = write_file(tmp_path / "m" / "model.safetensors", some_big(3))
    gcs.upload("cached", "m", tmp_path / "m")
    url = "gs://cached/m/model.safetensors"
    root = tmp_path / "cache"
    assert_matches_files(await load_model(url, cache_dir=root), path)
    cache = ModelCache(root)
    await cache.wait_committed()
    [entry] = cache.entries()
    assert entry.complete and entry.url == url
    assert (await cache.fetch(url)).hit  # same generation: found

    # A new upload is a new generation: the entry is not reused.
    newer = write_file(tmp_path / "n" / "model.safetensors", some_big(4))
    gcs.put("cached", "m/model.safetensors", newer.read_bytes())
    model = await cache.fetch(url)
    assert not model.hit
    assert_matches_files(await load_model(url, cache_dir=root), newer)


def test_the_credentials_in_use_are_named_with_the_secret_masked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("google.auth")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account", "project_id": "proj", "private_key_id": "k1",
        "private_key": pem, "client_email": "loader-bot@proj.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token",
    }  # fmt: skip
    import json

    creds = tmp_path / "sa.json"
    creds.write_text(json.dumps(info))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    credentials, described = _find()
    assert credentials is not None
    assert "service account loa***@proj.iam.gserviceaccount.com" in described
    assert str(creds) in described and "PRIVATE KEY" not in described
    with Lane("setup", 1) as lane:
        signer = GcsSigner(lane)
        asyncio.run(signer.setup())
    message = signer.describe_denied("gs://b/o", 403, "Forbidden")
    assert "loa***@proj.iam.gserviceaccount.com" in message and "objectViewer" in message


def test_a_credentials_file_that_cannot_be_used_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("google.auth")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    with pytest.raises(ConfigError, match=r"GOOGLE_APPLICATION_CREDENTIALS=.*missing\.json"):
        _find()
