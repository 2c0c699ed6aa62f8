"""Every file read whole is checked against the digest its publisher gives (issue 33, item 4).

The storage host flips one byte of a file in every answer that carries it
(``FaultyHttpServer.corrupt``), keeping its ETag: the Hub's LFS sha256 (its listing)
and S3's full-object checksum (a HEAD in checksum mode) are then the only witnesses.
A load, a stream, a staged (GPU path) load and ``aioloader fetch`` each refuse the
file, naming it and both digests; with the fault gone the same call returns the
model bit for bit. sources/verifying.py is what is tested.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from aioloader import DigestMismatchError, Loader, load_model, wait_hf_cache
from aioloader.devices.staged import HostCopyEngine
from aioloader.fetch.copy import PARTIAL_PREFIX
from aioloader.settings.values import S3Options
from aioloader.sources import verifying
from aioloader.sources.digests import hub_digest, s3_digest
from aioloader.sources.http.rules import PROBE_SIZE

from . import test_hf
from .helpers import assert_matches_files, write_file
from .hub_server import LocalHub
from .s3_server import MotoS3Server

pytest.importorskip("huggingface_hub")

hub = test_hf.hub  # the local Hub fixture; its hub cache is tmp_path / "hf-cache"

REPO = "org/digest"
# Reads of 64 KiB: the 8 MiB file is read in 128 ranges, 16 at a time, finishing out
# of order; the default reads it in one.
SMALL_READS: dict[str, Any] = {"chunk_size": "64KiB", "concurrency": 16}


def _model(tmp_path: Path, hub: LocalHub) -> Path:
    """A repository of one 8 MiB file of eight tensors, and a config."""
    folder = tmp_path / "src"
    gen = torch.Generator().manual_seed(7)
    tensors = {f"w{i}": torch.randn(1 << 18, generator=gen) for i in range(8)}
    shard = write_file(folder / "model.safetensors", tensors)
    (folder / "config.json").write_bytes(b'{"model_type": "test"}')
    hub.commit(REPO, test_hf._files(folder))
    return shard


def _data_start(shard: Path) -> int:
    return 8 + int.from_bytes(shard.read_bytes()[:8], "little")


def _flip(hub: LocalHub, shard: Path, at: int) -> tuple[str, str]:
    """Have the storage host flip byte ``at`` of ``shard``: (published, received) sha256."""
    data = bytearray(shard.read_bytes())
    published = hashlib.sha256(data).hexdigest()
    data[at] ^= 0xFF
    hub.storage.corrupt(published, at)
    return published, hashlib.sha256(data).hexdigest()


def _assert_names(error: DigestMismatchError, url_end: str, published: str, got: str) -> None:
    message = str(error)
    assert error.url.endswith(url_end) and url_end in message
    assert (error.expected, error.actual) == (published, got)
    assert published in message and got in message and "again" in message


def _cached_blob(tmp_path: Path, published: str) -> Path:
    return tmp_path / "hf-cache" / "models--org--digest" / "blobs" / published


@pytest.mark.parametrize(
    ("where", "reads"),
    [
        ("first tensor", {}),
        ("last byte", {}),
        ("first tensor", SMALL_READS),
        ("last byte", SMALL_READS),
    ],
)
async def test_a_flipped_byte_fails_an_hf_load_naming_the_file_and_both_digests(
    hub: LocalHub, tmp_path: Path, where: str, reads: dict[str, Any]
) -> None:
    shard = _model(tmp_path, hub)
    at = _data_start(shard) + 5 if where == "first tensor" else shard.stat().st_size - 1
    published, got = _flip(hub, shard, at)
    # One range past the probe answers late: the ranges after it arrive first.
    hub.storage.stall(published, 0.3, before_headers=True, past=PROBE_SIZE)
    with pytest.raises(DigestMismatchError) as info:
        await load_model(f"hf://{REPO}", **reads)
    _assert_names(info.value, "/model.safetensors", published, got)
    await wait_hf_cache()
    assert not _cached_blob(tmp_path, published).exists()

    hub.storage.clear_faults()
    hub.storage.stall(published, 0.3, before_headers=True, past=PROBE_SIZE)
    assert_matches_files(await load_model(f"hf://{REPO}", **reads), shard)
    await wait_hf_cache()
    assert _cached_blob(tmp_path, published).read_bytes() == shard.read_bytes()


async def test_a_stream_hands_out_tensors_then_fails_at_the_end_of_the_file(
    hub: LocalHub, tmp_path: Path
) -> None:
    shard = _model(tmp_path, hub)
    published, got = _flip(hub, shard, _data_start(shard) + 5)  # in w0
    # The file's last range comes late: every other tensor is out before it arrives.
    size = shard.stat().st_size
    hub.storage.stall(published, 0.3, before_headers=True, past=size - (64 << 10))
    seen: list[str] = []
    with pytest.raises(DigestMismatchError) as info:
        async with Loader(**SMALL_READS) as loader:
            async with loader.stream(f"hf://{REPO}") as stream:
                async for name, _ in stream:
                    seen.append(name)
    _assert_names(info.value, "/model.safetensors", published, got)
    assert "w0" in seen, "a stream hands a tensor out before its file's digest is complete"

    hub.storage.clear_faults()
    async with Loader(**SMALL_READS) as loader:
        async with loader.stream(f"hf://{REPO}") as stream:
            streamed = {name: tensor.clone() async for name, tensor in stream}
    assert_matches_files(streamed, shard)


@pytest.mark.parametrize(("hf_cache", "hold"), [(True, None), (False, None), (True, 0)])
async def test_a_staged_load_refuses_the_file_too(
    hub: LocalHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hf_cache: bool,
    hold: int | None,
) -> None:
    """The GPU path, run on the CPU: its staging slots are reused as soon as each copy
    is done, so each range is hashed, or copied, before its read returns; with no room
    for copies (``hold=0``), a range that came early is read again when the hash gets
    to it."""
    shard = _model(tmp_path, hub)
    if hold is not None:
        monkeypatch.setattr(verifying, "HOLD_LIMIT", hold)
    published, got = _flip(hub, shard, shard.stat().st_size // 2)
    hub.storage.stall(published, 0.3, before_headers=True, past=PROBE_SIZE)
    staged: dict[str, Any] = {"chunk_size": "64KiB", "memory_limit": "512KiB", "hf_cache": hf_cache}
    with pytest.raises(DigestMismatchError) as info:
        async with Loader(device=HostCopyEngine(), **staged) as loader:
            await loader.load(f"hf://{REPO}")
    _assert_names(info.value, "/model.safetensors", published, got)
    await wait_hf_cache()
    assert not _cached_blob(tmp_path, published).exists()
    assert not list((tmp_path / "hf-cache").rglob("*.tmp"))

    hub.storage.clear_faults()
    hub.storage.stall(published, 0.3, before_headers=True, past=PROBE_SIZE)
    sent = hub.storage.bytes_sent
    async with Loader(device=HostCopyEngine(), **staged) as loader:
        assert_matches_files(await loader.load(f"hf://{REPO}"), shard)
    if hold == 0:
        # The ranges that came before the late one were read again, not kept.
        assert hub.storage.bytes_sent - sent > shard.stat().st_size


def _fetch(hub: LocalHub, tmp_path: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "HF_TOKEN_PATH": str(tmp_path / "no-token"),
    }
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "aioloader", "fetch", f"hf://{REPO}", str(dest)],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def test_fetch_exits_non_zero_and_writes_nothing_of_the_bad_file(
    hub: LocalHub, tmp_path: Path
) -> None:
    shard = _model(tmp_path, hub)
    published, got = _flip(hub, shard, shard.stat().st_size - 1)
    dest = tmp_path / "dest"
    done = _fetch(hub, tmp_path, dest)
    assert done.returncode != 0
    assert "model.safetensors" in done.stderr
    assert published in done.stderr and got in done.stderr
    assert not (dest / "model.safetensors").exists()
    assert not list(dest.glob(PARTIAL_PREFIX + "*"))
    assert not [p for p in dest.rglob("*") if p.is_file() and p.name.endswith(".safetensors")]

    hub.storage.clear_faults()
    done = _fetch(hub, tmp_path, dest)
    assert done.returncode == 0, done.stderr
    assert (dest / "model.safetensors").read_bytes() == shard.read_bytes()


# -- S3: the full-object checksum an object was uploaded with ------------------------


def _upload(s3: MotoS3Server, bucket: str, key: str, data: bytes, algorithm: str) -> None:
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    if algorithm == "CRC32C":  # botocore computes it only with awscrt: set it as S3 keeps it
        crc32c = pytest.importorskip("google_crc32c")
        client.put_object(Bucket=bucket, Key=key, Body=data)
        stored = _stored(bucket, key)
        stored.checksum_algorithm = "CRC32C"
        stored.checksum_value = base64.b64encode(crc32c.value(data).to_bytes(4, "big")).decode()
    else:
        client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm=algorithm)


def _stored(bucket: str, key: str) -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, key)


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "SHA1", "SHA256"])
async def test_s3_full_object_checksum_refuses_a_flipped_byte(
    s3_env: MotoS3Server, tmp_path: Path, algorithm: str
) -> None:
    gen = torch.Generator().manual_seed(11)
    path = write_file(tmp_path / "m.safetensors", {"w": torch.randn(1 << 19, generator=gen)})
    data = path.read_bytes()
    bucket = f"digest-{algorithm.lower()}"
    _upload(s3_env, bucket, "m/model.safetensors", data, algorithm)
    url = f"s3://{bucket}/m/model.safetensors"
    s3 = S3Options(endpoint_url=s3_env.endpoint)
    assert_matches_files(await load_model(url, s3=s3, chunk_size="64KiB"), path)

    # The stored bytes change, the checksum the object was uploaded with stays.
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    stored = _stored(bucket, "m/model.safetensors")
    published = stored.checksum_value
    stored.value = bytes(bad)
    with pytest.raises(DigestMismatchError) as info:
        await load_model(url, s3=s3, chunk_size="64KiB")
    error = info.value
    assert error.url == url and error.algorithm == algorithm.lower()
    assert error.expected == published and published in str(error)
    assert f"x-amz-checksum-{algorithm.lower()}" in str(error)


# -- the digests themselves (pure) ---------------------------------------------------


def test_a_git_blob_id_is_the_sha1_of_the_header_and_the_bytes() -> None:
    data = b'{"model_type": "test"}'
    oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    digest = hub_digest(oid, len(data), "'config.json'")
    assert digest is not None
    running = digest.running()
    assert running is not None
    running.update(memoryview(data))
    assert running.result() == oid
    assert hub_digest("", 3, "x") is None and hub_digest("z" * 64, 3, "x") is None


def test_only_a_full_object_checksum_is_one_to_check() -> None:
    crc = base64.b64encode(b"\x01\x02\x03\x04").decode()
    assert s3_digest({"x-amz-checksum-crc32": crc}) is not None
    typed = {"x-amz-checksum-crc32": crc, "x-amz-checksum-type": "FULL_OBJECT"}
    assert s3_digest(typed) is not None
    assert s3_digest({**typed, "x-amz-checksum-type": "COMPOSITE"}) is None
    assert s3_digest({"x-amz-checksum-sha256": "abc=-3"}) is None
    assert s3_digest({}) is None


# -- through the node cache (cache_dir=, ModelCache.fetch) ---------------------------


async def test_a_node_cache_load_refuses_the_file_and_caches_none_of_it(
    hub: LocalHub, tmp_path: Path
) -> None:
    shard = _model(tmp_path, hub)
    published, got = _flip(hub, shard, _data_start(shard) + 5)
    cache = tmp_path / "node-cache"
    for _ in range(2):  # the second try finds nothing of the first one's bytes to resume
        with pytest.raises(DigestMismatchError) as info:
            await load_model(f"hf://{REPO}", cache_dir=cache, **SMALL_READS)
        _assert_names(info.value, "/model.safetensors", published, got)
    hub.storage.clear_faults()
    assert_matches_files(await load_model(f"hf://{REPO}", cache_dir=cache), shard)
    assert_matches_files(await load_model(f"hf://{REPO}", cache_dir=cache), shard)


async def test_a_model_cache_fetch_refuses_the_file_and_keeps_none_of_it(
    hub: LocalHub, tmp_path: Path
) -> None:
    from aioloader import ModelCache

    shard = _model(tmp_path, hub)
    published, got = _flip(hub, shard, _data_start(shard) + 5)
    cache = ModelCache(tmp_path / "node-cache")
    for _ in range(2):  # a retry (the daemon's) does not resume the refused bytes
        with pytest.raises(DigestMismatchError) as info:
            await cache.fetch(f"hf://{REPO}", chunk_size="64KiB")
        _assert_names(info.value, "/model.safetensors", published, got)
    hub.storage.clear_faults()
    model = await cache.fetch(f"hf://{REPO}", chunk_size="64KiB")
    assert isinstance(model.path, str)
    assert_matches_files(await load_model(model.path), shard)
