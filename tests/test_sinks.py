"""A cache sink fed by a FillingBlob (sinks/): both ways to the disk, the hub cache's sink.

The node cache's sink is tested through loads (test_cache*.py); here the hub cache's
is fed directly, with ranges read in any order, twice and overlapping, as the ranks
and the retries of a load may read them.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path

import pytest

from aioloader.runtime.threads import Lanes
from aioloader.sinks import commits
from aioloader.sinks.filling_blob import FillingBlob
from aioloader.sinks.hf.blob_writer import WeightFile
from aioloader.sinks.hf.sink import filling
from aioloader.sources.file import FileSource
from aioloader.sources.hf.hf_cache import HfCache
from aioloader.sources.hf.snapshot import Snapshot

from .helpers import random_tensors, write_file

REPO = "org/model"


def _target(tmp_path: Path, data: bytes) -> WeightFile:
    cache = HfCache(tmp_path / "hf-cache", REPO)
    snapshot = Snapshot(REPO, "main", "a" * 40, {"m.safetensors": len(data)})
    blob_id = hashlib.sha256(data).hexdigest()
    return WeightFile(cache, snapshot, "m.safetensors", len(data), blob_id)


@pytest.mark.parametrize("through", [True, False], ids=["through", "after"])
async def test_ranges_read_in_any_order_make_one_right_blob(tmp_path: Path, through: bool) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=20, big=200_000))
    data = path.read_bytes()
    target = _target(tmp_path, data)
    rng = random.Random(11)
    ranges = [(start, min(len(data), start + 40_000)) for start in range(0, len(data), 25_000)]
    ranges += rng.sample(ranges, 6)
    rng.shuffle(ranges)

    with Lanes(4) as lanes:
        files = FileSource(lanes)
        try:
            blob = await filling(
                await files.open(str(path)), target, lanes.cache if through else None, lanes.cache
            )
            assert isinstance(blob, FillingBlob)
            header = await blob.read_bytes(0, 8)
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
    await commits.wait(target.cache.root)
    assert header == data[:8]
    assert all(b == data[s:e] for (s, e), b in zip(ranges, buffers, strict=True))
    assert target.cache.blob(target.blob_id).read_bytes() == data
    assert target.cache.file(target.snapshot.sha, "m.safetensors").read_bytes() == data
    assert not list(target.cache.root.rglob("*.tmp"))


@pytest.mark.parametrize("through", [True, False], ids=["through", "after"])
async def test_a_file_not_read_whole_leaves_nothing(tmp_path: Path, through: bool) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=8, big=100_000))
    data = path.read_bytes()
    target = _target(tmp_path, data)

    with Lanes(2) as lanes:
        files = FileSource(lanes)
        try:
            blob = await filling(
                await files.open(str(path)), target, lanes.cache if through else None, lanes.cache
            )
            half = bytearray(len(data) // 2)
            await blob.read_into(0, [memoryview(half)])
            await blob.aclose()
        finally:
            await files.aclose()
    await commits.wait(target.cache.root)
    assert bytes(half) == data[: len(half)]
    assert not target.cache.blob(target.blob_id).exists()
    assert not list(target.cache.root.rglob("*.tmp"))
