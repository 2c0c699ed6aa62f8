"""A file downloaded from the swarm is seeded next from its cache entry: the same torrent,
added again at once at another path. libtorrent removes a torrent asynchronously; adding
it again before it is gone used to hand back the dying handle."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("libtorrent")

from aioloader.swarm.session import Swarm
from aioloader.swarm.torrents import info_hash, make_torrent

SIZE = 3 << 20


@pytest.fixture
async def swarms() -> AsyncIterator[list[Swarm]]:
    made: list[Swarm] = []
    yield made
    for swarm in made:
        await swarm.aclose()


async def _swarm(made: list[Swarm], n: int, allow: list[int]) -> Swarm:
    swarm = Swarm(f"127.0.0.{n}", 0, stall=20)
    made.append(swarm)
    await swarm.start()
    await swarm.allow([f"127.0.0.{i}" for i in allow])
    return swarm


async def test_a_download_seeded_again_from_its_entry_serves_the_next_peer(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    data = tmp_path / "origin" / "data"
    data.parent.mkdir()
    data.write_bytes(os.urandom(SIZE))
    torrent = await asyncio.to_thread(make_torrent, data, "model.safetensors")
    first = await _swarm(swarms, 31, [32, 33])
    second = await _swarm(swarms, 32, [31, 33])
    third = await _swarm(swarms, 33, [31, 32])
    await first.seed(torrent, data)

    for _ in range(5):  # the race is between two libtorrent threads: give it chances
        download = await second.download(torrent, tmp_path / "in", [("127.0.0.31", first.port)])
        async with asyncio.timeout(60):
            await download.wait_range(0, SIZE)
        entry = tmp_path / "entry" / "data"
        entry.parent.mkdir(exist_ok=True)
        shutil.copyfile(tmp_path / "in" / "model.safetensors", entry)
        await second.seed(torrent, entry)  # at once, the download still in the session
        assert second.seeding(info_hash(torrent))
        await download.aclose()  # replaced: leaves the seed alone
        assert second.seeding(info_hash(torrent))
        await first.remove(info_hash(torrent))  # the next peer can only have it from `second`
        got = await third.download(torrent, tmp_path / "third", [("127.0.0.32", second.port)])
        async with asyncio.timeout(60):
            await got.wait_range(0, SIZE)
        assert (tmp_path / "third" / "model.safetensors").read_bytes() == data.read_bytes()
        await got.aclose()
        await first.seed(torrent, data)
        await second.remove(info_hash(torrent))
        shutil.rmtree(tmp_path / "third")
        shutil.rmtree(tmp_path / "in")
