"""Cancelled loads and fetches through the cache leave no lock and no descriptor behind.

A leaked ``lock`` descriptor keeps the entry's flock: every later load of the URL, in
any process of the node, would wait for it forever. A leaked ``data.partial`` keeps a
deleted file's disk space.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from aioloader import Loader, ModelCache, load_model

from .helpers import assert_matches_files, random_tensors, write_sharded
from .servers import FaultyHttpServer


def fds_into(folder: Path) -> list[str]:
    """The targets of this process's descriptors that lie in ``folder``."""
    inside = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{folder}/"):
            inside.append(target)
    return inside


async def turns_to_finish(coro: Coroutine[Any, Any, Any]) -> int:
    """Event-loop turns that ``coro`` takes to finish (most are waits on the network)."""
    task = asyncio.get_running_loop().create_task(coro)
    turns = 0
    while not task.done():
        await asyncio.sleep(0)
        turns += 1
    await task
    return turns


def spread(turns: int, points: int = 40) -> list[int]:
    """``points`` cancellation points across a load of ``turns`` loop turns."""
    return sorted({turns * i // points for i in range(points)})


async def cancel_after(coro: Coroutine[Any, Any, Any], ticks: int) -> None:
    """Run ``coro`` for ``ticks`` loop turns, then cancel it (unless it is done by then)."""
    task = asyncio.get_running_loop().create_task(coro)
    for _ in range(ticks):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def stream_all(loader: Loader, url: str) -> None:
    async with loader.stream(url) as stream:
        async for _ in stream:
            pass


@pytest.fixture
def sharded(http_server: FaultyHttpServer) -> tuple[str, list[Path]]:
    index = write_sharded(http_server.root / "m", random_tensors(count=9), shards=3)
    return (
        http_server.url_for("m/model.safetensors.index.json"),
        sorted(index.parent.glob("*.safetensors")),
    )


async def test_cancelled_loads_leak_no_lock_or_descriptor(
    sharded: tuple[str, list[Path]], tmp_path: Path
) -> None:
    url, shards = sharded
    caches = tmp_path / "caches"
    turns = await turns_to_finish(load_model(url, cache_dir=caches / "whole", concurrency=2))
    # Each cancellation point gets a fresh cache, so every one of them meets the
    # cold path (probe, lock, partial file) rather than an entry completed before.
    points = spread(turns)
    for ticks in points:
        async with Loader(cache_dir=caches / str(ticks), concurrency=2) as loader:
            await cancel_after(stream_all(loader, url), ticks)
        await ModelCache(caches / str(ticks)).wait_committed()
        await ModelCache(caches / "whole").wait_committed()
        assert fds_into(caches) == [], f"cancelled after {ticks} of {turns} loop turns"
    for ticks in points[::8]:
        got = await asyncio.wait_for(load_model(url, cache_dir=caches / str(ticks)), 10)
        assert_matches_files(got, *shards)
        await ModelCache(caches / str(ticks)).wait_committed()
    assert fds_into(caches) == []


async def test_cancelled_loads_of_one_entry_never_wedge_it(
    sharded: tuple[str, list[Path]], tmp_path: Path
) -> None:
    url, shards = sharded
    root = tmp_path / "cache"
    cache = ModelCache(root)
    turns = await turns_to_finish(load_model(url, cache_dir=tmp_path / "other", concurrency=2))
    for i, ticks in enumerate(spread(turns, 24)):
        async with Loader(cache_dir=cache, concurrency=2) as loader:
            await cancel_after(stream_all(loader, url), ticks)
        await cache.wait_committed()
        assert fds_into(root) == [], f"cancelled after {ticks} of {turns} loop turns"
        if i % 3 == 2:
            # Start cold again: removing takes each entry's lock, which must be free.
            for entry in await asyncio.to_thread(cache.entries):
                await asyncio.wait_for(cache.remove(entry.url), 5)
    got = await asyncio.wait_for(load_model(url, cache_dir=root), 10)
    assert_matches_files(got, *shards)


async def test_cancelled_fetches_leak_no_descriptor(
    sharded: tuple[str, list[Path]], tmp_path: Path
) -> None:
    url, shards = sharded
    caches = tmp_path / "caches"
    turns = await turns_to_finish(ModelCache(caches / "whole").fetch(url, concurrency=2))
    points = spread(turns)
    for ticks in points:
        await cancel_after(ModelCache(caches / str(ticks)).fetch(url, concurrency=2), ticks)
        assert fds_into(caches) == [], f"cancelled after {ticks} of {turns} loop turns"
    for ticks in points[::8]:
        model = await asyncio.wait_for(ModelCache(caches / str(ticks)).fetch(url), 10)
        assert isinstance(model.path, str)
        assert_matches_files(await load_model(model.path), *shards)


async def test_cancelled_streams_of_a_long_lived_loader_release_every_entry(
    sharded: tuple[str, list[Path]], tmp_path: Path
) -> None:
    """A stream cancelled while its load closes its files must still close all of them,
    not leave the rest (and their entry locks) open until the Loader itself closes."""
    url, shards = sharded
    root = tmp_path / "cache"
    async with Loader(cache_dir=root, concurrency=2) as loader:
        # Warm: later loads open local entries, hold their use locks, and close them.
        await loader.load(url)
        turns = await turns_to_finish(stream_all(loader, url))
        for ticks in spread(turns + 5, 60):
            await cancel_after(stream_all(loader, url), ticks)
            assert fds_into(root) == [], f"cancelled after {ticks} of {turns} loop turns"
        assert_matches_files(await asyncio.wait_for(loader.load(url), 10), *shards)
