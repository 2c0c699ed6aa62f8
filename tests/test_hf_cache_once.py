"""The hub cache's write after a host load: the load's check of the Hub's sha256 is the
commit's, each range's copy checked against a digest taken as it arrived (sinks/hf/).

Loads come from the local Hub (tests/hub_server.py), tensors compared bit for bit with
safetensors; ``write_blob`` is fed ranges directly where a load cannot make them.
"""

from __future__ import annotations

import hashlib
import logging
import random
from pathlib import Path
from typing import Any

import pytest
import xxhash

from aioloader import load_model
from aioloader.sinks.hf.blob_writer import WeightFile, write_blob
from aioloader.sinks.hf.cache_writes import wait_hf_cache
from aioloader.sources.hf.hf_cache import HfCache
from aioloader.sources.hf.snapshot import Snapshot

from . import test_hf_cache
from .helpers import assert_matches_files
from .hub_server import LocalHub

hub = test_hf_cache.hub
REPO = test_hf_cache.REPO


async def test_a_blob_is_hashed_once(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load checks each file against the Hub's sha256 as it arrives; the commit takes
    that check instead of a second pass over the blob (5.6 s to a written cache against
    a 2.4 s load for 512 MiB, before)."""
    _, folder = test_hf_cache._repo(tmp_path, hub)
    hashed = _count_sha256(monkeypatch)
    got = await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    shards = sorted(folder.glob("*.safetensors"))
    weights = sum(p.stat().st_size for p in shards)
    assert_matches_files(got, *shards)
    test_hf_cache._assert_every_blob_whole(tmp_path / "hf-cache")
    for shard in shards:
        blob = hashlib.sha256(shard.read_bytes()).hexdigest()
        assert (tmp_path / "hf-cache" / "models--org--model" / "blobs" / blob).is_file()
    assert weights <= hashed[0] < weights * 1.2, (hashed[0], weights)


def _count_sha256(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the bytes every sha256 made from now on takes in."""
    counted = [0]
    real_new, real_sha256 = hashlib.new, hashlib.sha256

    class Counting:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def update(self, data: Any) -> None:
            counted[0] += memoryview(data).nbytes
            self._inner.update(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    def new(name: str, *args: Any, **kwargs: Any) -> Any:
        made = real_new(name, *args, **kwargs)
        return Counting(made) if name.lower() == "sha256" else made

    monkeypatch.setattr(hashlib, "new", new)
    monkeypatch.setattr(hashlib, "sha256", lambda *a, **k: Counting(real_sha256(*a, **k)))
    return counted


def _kept(offset: int, data: bytes) -> tuple[int, list[memoryview], str]:
    return offset, [memoryview(data)], xxhash.xxh3_64(data).hexdigest()


@pytest.mark.parametrize("which", ["first", "second"])
def test_overlapping_ranges_that_differ_are_hashed_from_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    """A header probe and the tensors after it overlap; a server that sent other bytes
    the second time gave two ranges that each match their own arrival digest. The file
    written is then hashed from disk: committed when what was written is the blob
    (the first range's bytes are), refused when not."""
    data = random.Random(5).randbytes(300_000)
    blob_id = hashlib.sha256(data).hexdigest()
    cache = HfCache(tmp_path / "hf-cache", REPO)
    snapshot = Snapshot(REPO, "main", "a" * 40, {"m.safetensors": len(data)})
    WeightFile(cache, snapshot, "m.safetensors", len(data), blob_id)
    probe, rest = bytearray(data[:65_536]), bytearray(data[1000:])
    (probe if which == "first" else rest)[2000] ^= 0xFF  # inside the overlap
    kept = [_kept(1000, bytes(rest)), _kept(0, bytes(probe))]
    with caplog.at_level(logging.WARNING):
        committed = write_blob(cache, blob_id, len(data), kept, checked=True)
    assert committed is (which == "second")  # the probe, first in the file, is written
    if committed:
        assert cache.blob(blob_id).read_bytes() == data
    else:
        assert not cache.blob(blob_id).exists()
        assert "do not match the digest the Hub publishes" in caplog.text
    assert not list(cache.root.rglob("*.tmp"))


def test_a_range_changed_since_it_arrived_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A range whose bytes changed after its arrival digest (a tensor the caller changed
    in place) fails the commit of a checked file, though no sha256 is taken."""
    data = random.Random(6).randbytes(200_000)
    blob_id = hashlib.sha256(data).hexdigest()
    cache = HfCache(tmp_path / "hf-cache", REPO)
    tensor = bytearray(data[100_000:])
    kept = [_kept(0, data[:100_000]), _kept(100_000, bytes(tensor))]
    kept[1] = (100_000, [memoryview(tensor)], kept[1][2])
    tensor[-1] ^= 0x01  # changed after its digest was taken
    with caplog.at_level(logging.WARNING):
        assert write_blob(cache, blob_id, len(data), kept, checked=True) is False
    assert not cache.blob(blob_id).exists()
    assert "tensor changed in place" in caplog.text
    assert not list(cache.root.rglob("*.tmp"))
