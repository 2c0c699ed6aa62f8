"""A load through the cache returns before its new entries are committed (commit.py).

The commit (hash, fsync, rename, meta) runs in the background; a process that
exits normally waits for it, and one that dies first leaves an entry the next
load finishes from its journaled partial file without downloading it again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from aioloader import Loader, ModelCache, load_model
from aioloader.cache.checksum import hash_file
from aioloader.cache.entry import EntryFiles, Version
from aioloader.cache.partial import PartialFile, RangeMismatch, range_digest

from .helpers import assert_matches_files, write_file, write_sharded
from .servers import FaultyHttpServer
from .test_cache import big_tensors, data_gets, entry_dir, meta_of

# The child loads through the cache and exits. With "--die" it first fills both
# commit threads with jobs that never end, so the load's own commits cannot start,
# and leaves with os._exit, the way a killed process leaves: no thread is joined.
_CHILD = """
import asyncio, os, sys, threading
from pathlib import Path
from aioloader import load_model
from aioloader.sinks import commits

url, root, die = sys.argv[1], sys.argv[2], sys.argv[3] == "--die"
if die:
    never = threading.Event()
    for _ in range(4):
        commits.submit(Path(root) / "elsewhere", never.wait)
tensors = asyncio.run(load_model(url, cache_dir=root))
print(len(tensors), flush=True)
if die:
    os._exit(0)
"""


def _load_in_child(url: str, root: Path, *, die: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, str(root), "--die" if die else "--exit"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0


def _model(server: FaultyHttpServer) -> tuple[str, list[Path], list[str]]:
    index = write_sharded(server.root / "m", big_tensors(), shards=2)
    shards = sorted(index.parent.glob("*.safetensors"))
    return (
        server.url_for("m/model.safetensors.index.json"),
        shards,
        [server.url_for(f"m/{p.name}") for p in shards],
    )


async def test_a_process_that_dies_before_its_commits_leaves_entries_finished_without_download(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    url, shards, shard_urls = _model(http_server)
    root = tmp_path / "cache"
    _load_in_child(url, root, die=True)

    for shard in shard_urls:
        # Every byte arrived and is journaled, but the entry was never committed.
        assert meta_of(root, shard)["complete"] is False
        assert (entry_dir(root, shard) / "data.partial").exists()
        assert not (entry_dir(root, shard) / "data").exists()

    http_server.reset_counters()
    got = await load_model(url, cache_dir=root)
    assert_matches_files(got, *shards)
    assert data_gets(http_server) == []  # read from the partial files, not the server
    cache = ModelCache(root)
    await cache.wait_committed()
    assert all(e.complete for e in cache.entries())
    assert {r.status for r in await cache.verify()} == {"ok"}


async def test_a_process_that_exits_normally_commits_its_entries_first(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    url, shards, shard_urls = _model(http_server)
    root = tmp_path / "cache"
    _load_in_child(url, root, die=False)

    for shard in shard_urls:
        meta = json.loads((entry_dir(root, shard) / "meta.json").read_text())
        assert meta["complete"] is True and str(meta["checksum"]).startswith("xxh3-128:")
    http_server.reset_counters()
    assert_matches_files(await load_model(url, cache_dir=root), *shards)
    assert data_gets(http_server) == []
    assert {r.status for r in await ModelCache(root).verify()} == {"ok"}


def test_direct_writes_of_aligned_unaligned_and_read_only_pieces(tmp_path: Path) -> None:
    """``O_DIRECT`` takes the page-aligned part of each piece; the rest is written buffered."""
    size = 5 * 4096 * 16 + 1234
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    page_aligned = np.empty(size + 4096, np.uint8)
    skip = -page_aligned.ctypes.data % 4096
    memory = page_aligned[skip : skip + size]
    memory[:] = data
    url = "http://example.invalid/m.safetensors"
    files = EntryFiles.of(tmp_path / "cache", url)
    partial = PartialFile.open(files, url, Version(size, '"v1"', None), direct=True)
    pieces = [
        (4096 * 16, 4096 * 16 + 300),  # aligned start, unaligned end
        (0, 4096 * 16),  # aligned
        (4096 * 32 + 300, 4096 * 48),  # unaligned start
        (4096 * 16 + 300, 4096 * 32 + 300),  # unaligned start and end
        (4096 * 64, size),  # the file's last partial page
    ]
    for start, end in pieces:
        partial.write(start, [memoryview(memory[start:end])])
    # Read-only memory (bytes) cannot be handed to O_DIRECT here: written buffered.
    partial.write(4096 * 48, [memoryview(data[4096 * 48 : 4096 * 64].tobytes())])
    meta = partial.complete()
    assert files.data.read_bytes() == data.tobytes()
    assert meta.complete and meta.checksum == hash_file(files.data)


async def test_verify_right_after_a_load_waits_for_its_commit(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """``verify`` checked a file whose commit was still running and called it "partial"
    (seen in CI); it now waits for this process's commits under its folder first."""
    write_file(http_server.root / "m.safetensors", {"w": torch.ones(16 << 20)})  # 64 MiB
    root = tmp_path / "cache"
    await load_model(http_server.url_for("m.safetensors"), cache_dir=root)
    assert [r.status for r in await ModelCache(root).verify()] == ["ok"]


def test_a_range_changed_before_its_write_is_caught_at_commit(tmp_path: Path) -> None:
    """Writes after hand-out: the digest is taken when the bytes arrive; a tensor changed in
    place before its bytes were written makes ``complete`` refuse the entry, in this
    process or in the one that resumes the partial file."""
    size = 3 * 65536
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    url = "http://example.invalid/m.safetensors"
    files = EntryFiles.of(tmp_path / "cache", url)
    version = Version(size, '"v1"', None)

    partial = PartialFile.open(files, url, version, direct=True)
    memory = data.copy()
    for start in range(0, size, 65536):
        views = [memoryview(memory[start : start + 65536])]
        digest = range_digest(views)
        if start == 65536:
            memory[start + 10] ^= 0xFF  # the caller changed it before the write
        partial.write(start, views, digest)
    with pytest.raises(RangeMismatch, match=r"bytes \[65536, 131072\)"):
        partial.complete()
    partial.close()

    # The journal keeps the digests: a resumed partial file checks them before it serves
    # anything, keeps the ranges that match and downloads the changed one again.
    resumed = PartialFile.open(files, url, version, direct=True)
    assert list(resumed.done) == [(0, 65536), (131072, size)]
    assert not resumed.covers(65536, 65537)
    resumed.write(65536, [memoryview(data[65536:131072].copy())])
    assert resumed.complete().complete
    assert files.data.read_bytes() == data.tobytes()

    # Untouched bytes pass.
    files.discard()
    partial = PartialFile.open(files, url, version, direct=True)
    for start in range(0, size, 65536):
        views = [memoryview(data[start : start + 65536].copy())]
        partial.write(start, views, range_digest(views))
    assert partial.complete().complete
    assert files.data.read_bytes() == data.tobytes()


async def test_tensors_changed_as_they_arrive_never_reach_the_cache_changed(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """A caller zeroes each tensor the moment it arrives (before its bytes may have been
    written to the cache): whatever the cache keeps is the server's bytes."""
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=16))
    root = tmp_path / "cache"
    url = http_server.url_for("m.safetensors")
    async with Loader(cache_dir=root, chunk_size="64KiB") as loader:
        async with loader.stream(url) as stream:
            async for _, tensor in stream:
                tensor.zero_()
    await ModelCache(root).wait_committed()
    assert {r.status for r in await ModelCache(root).verify()} <= {"ok", "missing"}
    assert_matches_files(await load_model(url, cache_dir=root), path)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("changed", [False, True])
def test_overlapping_ranges_written_after_hand_out_are_each_checked(
    tmp_path: Path, direct: bool, changed: bool
) -> None:
    """Two spans of a plan may share a 4 KiB block, so writes after hand-out may overlap,
    and one may start below where the hashing pass has already read."""
    size = 6 * 4096
    data = np.random.default_rng(2).integers(0, 256, size, dtype=np.uint8)
    url = "http://example.invalid/m.safetensors"
    files = EntryFiles.of(tmp_path / "cache", url)
    partial = PartialFile.open(files, url, Version(size, '"v1"', None), direct=direct)
    # [0, 12 KiB), then [8 KiB, 24 KiB): the block [8, 12) KiB is written twice.
    for start, stop in [(0, 3 * 4096), (2 * 4096, size)]:
        memory = data[start:stop].copy()
        views = [memoryview(memory)]
        digest = range_digest(views)
        if changed and start > 0:
            memory[100] ^= 0xFF  # changed before its write, inside the shared block
        partial.write(start, views, digest)
    if changed:
        with pytest.raises(RangeMismatch, match=r"bytes \[\d+, \d+\) of"):
            partial.complete()
        partial.close()
    else:
        assert partial.complete().complete
        assert files.data.read_bytes() == data.tobytes()
