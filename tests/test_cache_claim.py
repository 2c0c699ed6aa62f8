"""A load right after another load of the same entry waits for the first one's writes and
commit, which still hold the entry after it returned, and reads the entry: it does not
stream uncached (claim.py).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from aioloader import ModelCache, load_model
from aioloader.cache.claim import BUSY, Claim, claim
from aioloader.cache.entry import EntryFiles, Version
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_matches_files, assert_same, write_file
from .servers import FaultyHttpServer
from .test_cache import big_tensors, data_gets


class _LetGoBefore(ThreadPoolExecutor):
    """One thread; before running its ``at``-th call, ``let_go`` runs (a holder lets go)."""

    def __init__(self, at: int, let_go: Callable[[], None]) -> None:
        super().__init__(1)
        self.at = at
        self.calls = 0
        self._let_go = let_go

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        if self.calls == self.at:
            self._let_go()
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("at", [1, 2, 3, 4])
async def test_a_load_claims_an_entry_its_writer_lets_go_of_meanwhile(
    tmp_path: Path, at: int
) -> None:
    """A holder that waits for nothing else (a fetch, a load's commit) lets go while a load
    claims the entry, between any two of its steps: the load gets the entry. Letting go
    between its try of the lock and its look at the mark made it stream uncached."""
    url = "http://example.invalid/m.safetensors"
    files = EntryFiles.of(tmp_path / "cache", url)
    version = Version(1 << 20, '"v1"', None)
    with ThreadPoolExecutor(1) as lane:
        holder = await claim(files, version, lane, by="fetch")
    assert isinstance(holder, Claim)
    lane = _LetGoBefore(at, holder.release)
    try:
        got = await claim(files, version, lane, by="load", stall=10, url=url)
        assert got is not BUSY and isinstance(got, Claim), f"{got} after {lane.calls} calls"
        got.release()
    finally:
        holder.release()
        lane.shutdown()


async def test_a_load_held_by_another_load_is_read_uncached(tmp_path: Path) -> None:
    """The other side: a load still running (no mark) is never waited for."""
    url = "http://example.invalid/m.safetensors"
    files = EntryFiles.of(tmp_path / "cache", url)
    version = Version(1 << 20, '"v1"', None)
    with ThreadPoolExecutor(1) as lane:
        holder = await claim(files, version, lane, by="load")
        assert isinstance(holder, Claim)
        try:
            assert await claim(files, version, lane, by="load") is BUSY
        finally:
            holder.release()


async def test_loads_back_to_back_read_what_the_one_before_cached(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """Each load starts as soon as the one before returned, while that one's writes and
    commit run: a load of a subset, then of the whole file (which reads only what the
    subset did not), then again (which reads nothing). Each round a fresh cache."""
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=16))
    url = http_server.url_for("m.safetensors")
    size = path.stat().st_size
    reference = load_file(str(path))
    names = sorted(reference)[: len(reference) // 2]
    subset_bytes = sum(reference[n].nbytes for n in names)
    same = {"chunk_size": "64KiB", "concurrency": 1}
    for round in range(4):
        root = tmp_path / f"cache{round}"
        assert_same(
            await load_model(url, cache_dir=root, tensors=names, **same),
            {n: reference[n] for n in names},
        )
        http_server.reset_counters()
        assert_matches_files(await load_model(url, cache_dir=root, **same), path)
        # The probe and what the subset did not read (in 64 KiB reads), not the file.
        assert http_server.bytes_sent <= PROBE_SIZE + size - subset_bytes + 2 * 64 * 1024
        http_server.reset_counters()
        assert_matches_files(await load_model(url, cache_dir=root, **same), path)
        assert data_gets(http_server) == [], f"round {round}"
        cache = ModelCache(root)
        await cache.wait_committed()
        assert [r.status for r in await cache.verify(url)] == ["ok"]
