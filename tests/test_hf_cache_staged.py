"""The Hugging Face hub cache, written by staged (GPU path) hf:// loads.

A staged load reuses each staging slot as soon as its copy completes, so its bytes
are written into a temporary blob as they arrive (sinks/hf/blob_through.py). The
loads here run the GPU path into host memory (``HostCopyEngine``) with a ring far
smaller than the model, so slots are recycled many times. huggingface_hub is the
oracle, as in test_hf_cache.py; every tensor is compared bit for bit with safetensors.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioloader import DigestMismatchError, Loader, ReadError, wait_hf_cache
from aioloader.devices.staged import HostCopyEngine, StagedDevice
from aioloader.runtime.threads import Lanes
from aioloader.sinks import commits
from aioloader.sinks.hf import blob_through
from aioloader.sinks.hf.blob_through import TemporaryBlob
from aioloader.sinks.hf.blob_writer import WeightFile
from aioloader.sinks.hf.sink import filling
from aioloader.sources.file import FileSource
from aioloader.sources.hf.hf_cache import HfCache
from aioloader.sources.hf.snapshot import Snapshot

from . import test_hf
from .helpers import assert_matches_files, random_tensors, write_file
from .hub_server import LocalHub
from .test_hf_cache import (
    REPO,
    _assert_every_blob_whole,
    _oracle,
    _repo,
    _tree,
    assert_huggingface_hub_accepts,
)

hub = test_hf.hub  # the local Hub fixture; its hub cache is tmp_path / "hf-cache"
_files = test_hf._files

hf = pytest.importorskip("huggingface_hub")

# A ring of 8 KiB slots under 64 KiB: the 1.2 MB tensors go through it many times over.
_STAGED = {"chunk_size": "8KiB", "memory_limit": "64KiB"}


def _loader(**keywords: object) -> Loader:
    return Loader(device=HostCopyEngine(), **{**_STAGED, **keywords})  # type: ignore[arg-type]


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def _blob(tmp_path: Path, shard: Path) -> Path:
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    return tmp_path / "hf-cache" / "models--org--model" / "blobs" / digest


def _temporaries(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "hf-cache").rglob("*.tmp"))


def _assert_nothing_was_hashed(caplog: pytest.LogCaptureFixture) -> None:
    """A file not read whole is dropped as such, not offered to the digest check."""
    assert not any("do not match the digest" in r.getMessage() for r in caplog.records)


def _one_file(tmp_path: Path, hub: LocalHub) -> Path:
    """A repository of one 8 MiB file of 64 tensors: each of them 16 slot-sized reads,
    so the reads are never more than a tensor or two ahead of the consumer."""
    folder = tmp_path / "one"
    gen = torch.Generator().manual_seed(3)
    tensors = {f"w{i:02d}": torch.randn(32_768, generator=gen) for i in range(64)}
    write_file(folder / "model.safetensors", tensors)
    hub.commit(REPO, _files(folder))
    return folder / "model.safetensors"


async def test_a_staged_load_fills_the_cache_huggingface_hub_writes(
    hub: LocalHub, tmp_path: Path
) -> None:
    sha, folder = _repo(tmp_path, hub)
    async with _loader() as loader:
        got = await loader.load(f"hf://{REPO}")
        device = loader.device
        assert isinstance(device, StagedDevice)
        assert device.ring.copies > 10 * device.ring.slots, "slots were recycled"
    await wait_hf_cache()
    shards = _shards(folder)
    assert_matches_files(got, *shards)
    ours = tmp_path / "hf-cache"
    assert _tree(ours) == _tree(_oracle(hub, tmp_path))
    assert (ours / "models--org--model" / "refs" / "main").read_text() == sha
    assert not _temporaries(tmp_path)
    assert_huggingface_hub_accepts(hub, ours, sha, folder)

    # A warm load, staged too, reads the cache: no byte from the storage host.
    before = len(hub.storage.requests)
    async with _loader() as loader:
        assert_matches_files(await loader.load(f"hf://{REPO}"), *shards)
    assert len(hub.storage.requests) == before


async def test_the_commit_takes_the_load_s_digest_and_hashes_no_blob_again(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte of a staged load is hashed once, as it arrives (sources/verifying.py):
    the commit makes no second pass (it hashed each blob again from disk, 0.75-0.9 s of a
    core a GiB)."""
    _, folder = _repo(tmp_path, hub)
    passes: list[str] = []
    real = blob_through.blob_digest

    def counted(blob_id: str, size: int) -> object:
        passes.append(blob_id)
        return real(blob_id, size)

    monkeypatch.setattr(blob_through, "blob_digest", counted)
    async with _loader() as loader:
        got = await loader.load(f"hf://{REPO}")
    await wait_hf_cache()
    assert passes == []
    shards = _shards(folder)
    assert_matches_files(got, *shards)
    for shard in shards:
        assert _blob(tmp_path, shard).read_bytes() == shard.read_bytes()


async def test_a_corrupted_blob_is_never_committed(hub: LocalHub, tmp_path: Path) -> None:
    _, folder = _repo(tmp_path, hub)
    shard = _shards(folder)[0]
    stored = tmp_path / "hub-storage" / _blob(tmp_path, shard).name
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF  # the last tensor's last byte: the header still parses
    stored.write_bytes(bytes(data))
    # As for host loads, the load refuses the file (test_digest.py), and so does the cache.
    with pytest.raises(DigestMismatchError, match=shard.name):
        async with _loader() as loader:
            await loader.load(f"hf://{REPO}")
    await wait_hf_cache()
    assert not _blob(tmp_path, shard).exists()
    assert not list((tmp_path / "hf-cache").glob(f"models--org--model/snapshots/*/{shard.name}"))
    assert not _temporaries(tmp_path)


@pytest.mark.parametrize("fault", ["cut", "5xx"])
async def test_a_load_failing_midway_leaves_no_blob(
    hub: LocalHub, tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    shard = _one_file(tmp_path, hub)
    # Every read of the file's second half fails, whenever it comes: set before the load,
    # so that no read can run ahead of the fault.
    half = shard.stat().st_size // 2
    if fault == "cut":
        # Cut before any byte of the body: a cut that delivers bytes is progress, which
        # the retries resume from (and a reset may or may not drop them: timing).
        hub.storage.reset_after(None, 0, count=10_000, past=half)
    else:
        hub.storage.status(None, 500, count=10_000, past=half)
    with pytest.raises(ReadError):
        async with _loader(max_attempts=2) as loader:
            async with loader.stream(f"hf://{REPO}") as stream:
                async for _ in stream:
                    pass
    await wait_hf_cache()
    assert not _blob(tmp_path, shard).exists()
    assert not list((tmp_path / "hf-cache").glob("models--org--model/snapshots/*/*.safetensors"))
    assert not _temporaries(tmp_path)
    _assert_every_blob_whole(tmp_path / "hf-cache")
    _assert_nothing_was_hashed(caplog)


@pytest.mark.parametrize("after", [0, 1, 20, 50])
async def test_a_cancelled_stream_commits_nothing(
    hub: LocalHub, tmp_path: Path, after: int, caplog: pytest.LogCaptureFixture
) -> None:
    shard = _one_file(tmp_path, hub)
    arrived = asyncio.Event()

    async def consume(loader: Loader) -> None:
        async with loader.stream(f"hf://{REPO}") as stream:
            count = 0
            async for _ in stream:
                count += 1
                if count > after:
                    arrived.set()

    async with _loader() as loader:
        task = asyncio.create_task(consume(loader))
        await arrived.wait()  # mid-file: its first tensors are out, the rest is not read
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await wait_hf_cache()
    assert not _blob(tmp_path, shard).exists()
    assert not _temporaries(tmp_path)
    _assert_nothing_was_hashed(caplog)


async def test_a_partial_load_writes_no_file_it_did_not_read_whole(
    hub: LocalHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _repo(tmp_path, hub)
    async with _loader() as loader:
        await loader.load(f"hf://{REPO}", tensors=["big.0"])
    await wait_hf_cache()
    ours = tmp_path / "hf-cache" / "models--org--model"
    assert not list(ours.glob("snapshots/*/*.safetensors"))
    # Only the small files' blobs, named by their git sha1 (a weight's is a sha256).
    assert all(len(p.name) == 40 for p in ours.glob("blobs/*"))
    assert (ours / "refs" / "main").is_file()
    assert not _temporaries(tmp_path)
    _assert_nothing_was_hashed(caplog)


async def test_a_cache_that_cannot_take_the_blob_leaves_the_load_alone(
    hub: LocalHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, folder = _repo(tmp_path, hub)
    blobs = tmp_path / "hf-cache" / "models--org--model" / "blobs"
    blobs.parent.mkdir(parents=True)
    blobs.write_bytes(b"a file where the folder should be")
    with caplog.at_level(logging.WARNING):
        async with _loader() as loader:
            assert_matches_files(await loader.load(f"hf://{REPO}"), *_shards(folder))
        await wait_hf_cache()
    warned = [r.getMessage() for r in caplog.records if "was not cached" in r.getMessage()]
    assert len(warned) == len(_shards(folder))
    assert all("model-0000" in w and REPO in w for w in warned)
    assert blobs.read_bytes() == b"a file where the folder should be"


async def test_hf_cache_false_writes_nothing(hub: LocalHub, tmp_path: Path) -> None:
    _, folder = _repo(tmp_path, hub)
    async with _loader(hf_cache=False) as loader:
        assert_matches_files(await loader.load(f"hf://{REPO}"), *_shards(folder))
    await wait_hf_cache()
    assert not (tmp_path / "hf-cache").exists()


_CHILD = """
import asyncio, sys
from aioloader import Loader, wait_hf_cache
from aioloader.devices.staged import HostCopyEngine

async def main():
    async with Loader(device=HostCopyEngine(), chunk_size="8KiB", memory_limit="64KiB") as l:
        await l.load(sys.argv[1])
    await wait_hf_cache()

asyncio.run(main())
"""


def test_two_processes_fill_one_cache(hub: LocalHub, tmp_path: Path) -> None:
    _, folder = _repo(tmp_path, hub)
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, f"hf://{REPO}"]) for _ in range(2)]
    for child in children:
        assert child.wait(120) == 0
    _assert_every_blob_whole(tmp_path / "hf-cache")
    assert _tree(tmp_path / "hf-cache") == _tree(_oracle(hub, tmp_path))
    assert not _temporaries(tmp_path)
    for shard in _shards(folder):
        assert _blob(tmp_path, shard).read_bytes() == shard.read_bytes()


async def test_ranges_read_twice_and_overlapping_make_one_right_blob(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=20, big=200_000))
    data = path.read_bytes()
    blob_id = hashlib.sha256(data).hexdigest()
    cache = HfCache(tmp_path / "hf-cache", REPO)
    snapshot = Snapshot(REPO, "main", "a" * 40, {"m.safetensors": len(data)})
    target = WeightFile(cache, snapshot, "m.safetensors", len(data), blob_id)
    rng = random.Random(7)
    # Ranges that cover the file, overlap each other and repeat, read in random order.
    ranges = [(start, min(len(data), start + 50_000)) for start in range(0, len(data), 30_000)]
    ranges += rng.sample(ranges, 5)
    rng.shuffle(ranges)

    with Lanes(4) as lanes:
        files = FileSource(lanes)
        try:
            blob = await filling(await files.open(str(path)), target, lanes.cache)
            buffers = [bytearray(end - start) for start, end in ranges]
            await asyncio.gather(
                *(
                    blob.read_into(start, [memoryview(buffer)])
                    for (start, _), buffer in zip(ranges, buffers, strict=True)
                )
            )
            await blob.aclose()
        finally:
            await files.aclose()
    await commits.wait(cache.root)
    assert all(b == data[s:e] for (s, e), b in zip(ranges, buffers, strict=True))
    assert cache.blob(blob_id).read_bytes() == data
    assert cache.file(snapshot.sha, "m.safetensors").read_bytes() == data
    assert not list(cache.root.rglob("*.tmp"))


@pytest.mark.parametrize("again", ["the same bytes", "other bytes"])
def test_a_range_written_twice_is_taken_as_checked_only_with_the_same_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, again: str
) -> None:
    """The load checked the digest of the bytes it read first; a range written again (a
    header read twice) with the same bytes leaves the file as checked, committed with no
    second pass; with other bytes (a server that changed its answer) the file is hashed
    from disk and refused, though the load's check passed."""
    data = random.Random(3).randbytes(300_000)
    blob_id = hashlib.sha256(data).hexdigest()
    cache = HfCache(tmp_path / "hf-cache", REPO)
    snapshot = Snapshot(REPO, "main", "a" * 40, {"m.safetensors": len(data)})
    file = TemporaryBlob(WeightFile(cache, snapshot, "m.safetensors", len(data), blob_id))
    file.write(0, [memoryview(data)])
    header = bytearray(data[:4096])
    if again == "other bytes":
        header[100] ^= 0xFF
    file.write(0, [memoryview(header)[:1000], memoryview(header)[1000:]])
    with caplog.at_level(logging.WARNING):
        committed = file.publish(checked=True)
    assert committed is (again == "the same bytes")
    assert file.rewritten is (again == "other bytes")
    if committed:
        assert cache.blob(blob_id).read_bytes() == data
    else:
        assert not cache.blob(blob_id).exists()
        assert "do not match the digest the Hub publishes" in caplog.text
    assert not list(cache.root.rglob("*.tmp"))
