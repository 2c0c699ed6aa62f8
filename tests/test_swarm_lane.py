"""The swarm's one lane under load: reads of libtorrent's alerts shared among those who
wait for them (runtime/tasks.py's ``Shared``), and writes libtorrent is slow to confirm
blamed on this node, not on the peer that sent the bytes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from aioloader.runtime.tasks import Shared

SIZE = 3 << 20


# -- Shared ------------------------------------------------------------------------------


async def test_callers_waiting_at_once_share_one_call_begun_after_they_asked() -> None:
    calls: list[int] = []
    gate = asyncio.Event()

    async def read() -> None:
        calls.append(len(calls))
        await gate.wait()

    shared = Shared(read)
    first = asyncio.create_task(shared())
    await asyncio.sleep(0)  # the first call runs, held at the gate
    others = [asyncio.create_task(shared()) for _ in range(50)]
    await asyncio.sleep(0)
    assert calls == [0]  # the others wait: what the running call reads predates them
    gate.set()
    await asyncio.gather(first, *others)
    assert calls == [0, 1]  # one more call, begun after they all asked, served them all
    await shared()  # asked after every call ended: a call of its own
    assert calls == [0, 1, 2]


async def test_the_caller_whose_turn_ran_the_call_gets_its_error() -> None:
    gate = asyncio.Event()
    failures = iter([RuntimeError("the session is closed"), None])

    async def read() -> None:
        await gate.wait()
        error = next(failures)
        if error is not None:
            raise error

    shared = Shared(read)
    first = asyncio.create_task(shared())
    await asyncio.sleep(0)
    second = asyncio.create_task(shared())
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(RuntimeError, match="the session is closed"):
        await first
    await second  # its own call, begun after it asked, ended well
    assert "calls=2" in repr(shared)


async def test_a_caller_cancelled_while_its_call_runs_lets_the_next_call_begin() -> None:
    began = 0
    gate = asyncio.Event()

    async def read() -> None:
        nonlocal began
        began += 1
        await gate.wait()

    shared = Shared(read)
    first = asyncio.create_task(shared())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(shared())
    await asyncio.sleep(0)
    first.cancel()
    gate.set()
    await waiting
    assert began == 2 and first.cancelled()


# -- the swarm ---------------------------------------------------------------------------

lt = pytest.importorskip("libtorrent")

from aioloader.swarm import alerts  # noqa: E402
from aioloader.swarm.alerts import TorrentCounts  # noqa: E402
from aioloader.swarm.download import SwarmUnflushed  # noqa: E402
from aioloader.swarm.session import Swarm  # noqa: E402
from aioloader.swarm.settings_pack import settings_pack  # noqa: E402
from aioloader.swarm.torrents import info_hash, make_torrent  # noqa: E402

from .counted_lane import CountedLane  # noqa: E402

_NONE = TorrentCounts()


class _Withheld:
    """A libtorrent session whose alerts can be held back (``holding``: left in
    libtorrent's queue, as when it is slow to post them), its alert reads counted."""

    def __init__(self, session: object) -> None:
        self._session = session
        self.holding = False
        self.reads = 0

    def post_torrent_updates(self, flags: int) -> None:
        self.reads += 1  # a read of the alerts asks for the statuses once (alerts.py)
        self._session.post_torrent_updates(flags)  # type: ignore[attr-defined]

    def pop_alerts(self) -> list[object]:
        return [] if self.holding else self._session.pop_alerts()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._session, name)


async def _pair(tmp_path: Path, stall: float) -> tuple[Swarm, Swarm, Path, bytes]:
    data = tmp_path / "seed" / "data"
    data.parent.mkdir()
    data.write_bytes(os.urandom(SIZE))
    torrent = await asyncio.to_thread(make_torrent, data, "model.safetensors")
    seeder, leecher = Swarm("127.0.0.93", 0), Swarm("127.0.0.94", 0, stall=stall)
    for swarm, other in ((seeder, "127.0.0.94"), (leecher, "127.0.0.93")):
        await swarm.start()
        await swarm.allow([other])
    await seeder.seed(torrent, data)
    return seeder, leecher, data, torrent


async def _all_had(leecher: Swarm, torrent: bytes) -> None:
    """Until every piece of ``torrent`` is had at ``leecher``, by libtorrent's count."""
    async with asyncio.timeout(60):
        while (leecher.counts(info_hash(torrent)) or _NONE).done < SIZE:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_refreshes_asked_at_once_share_reads_of_the_alerts(tmp_path: Path) -> None:
    """At 32 nodes, 31 downloads waiting for their flushes each asked for a read of the
    alerts (and every held torrent's status) each 50 ms, one after the other in the
    session's one lane: flushes went unconfirmed for 30 s behind them."""
    seeder, leecher, _, _ = await _pair(tmp_path, 30.0)
    try:
        withheld = _Withheld(leecher._session)
        leecher._session = withheld  # type: ignore[assignment]
        await asyncio.gather(*(leecher.refresh() for _ in range(40)))
        assert withheld.reads <= 3  # (the session's own pump may have begun one)
        leecher._session = withheld._session  # type: ignore[assignment]
    finally:
        await leecher.aclose()
        await seeder.aclose()


async def test_writes_libtorrent_is_slow_to_confirm_are_this_node_s_not_the_peer_s(
    tmp_path: Path,
) -> None:
    """The range came whole and passed its hashes; only libtorrent's word that it is on
    disk is late. That is ``SwarmUnflushed`` (the fetch reads the range elsewhere and
    keeps the peer), not a stall of the peer's; and once the word comes, the range is
    read, however long ago its last block arrived."""
    seeder, leecher, data, torrent = await _pair(tmp_path, 1.0)
    withheld = _Withheld(leecher._session)
    try:
        download = await leecher.download(torrent, tmp_path / "in", [("127.0.0.93", seeder.port)])
        await _all_had(leecher, torrent)
        leecher._session = withheld  # type: ignore[assignment]
        withheld.holding = True
        with pytest.raises(SwarmUnflushed, match="did not confirm its writes within 1 s"):
            await download.wait_range(0, SIZE)
        await asyncio.sleep(1.5)  # longer than the stall time, nothing arriving
        withheld.holding = False
        async with asyncio.timeout(30):
            await download.wait_range(0, SIZE)
        assert (tmp_path / "in" / "model.safetensors").read_bytes() == data.read_bytes()
        await download.aclose()
    finally:
        leecher._session = withheld._session  # type: ignore[assignment]
        await leecher.aclose()
        await seeder.aclose()


class _LosesAFlush:
    """A libtorrent session that loses the next ``cache_flushed_alert`` it posts, as
    libtorrent does with alerts its queue has no room for (``alert_queue_size``)."""

    def __init__(self, session: object) -> None:
        self._session = session
        self.lost = 0

    def pop_alerts(self) -> list[object]:
        found = self._session.pop_alerts()  # type: ignore[attr-defined]
        if self.lost:
            return found
        kept = [a for a in found if not isinstance(a, lt.cache_flushed_alert)]
        self.lost = len(found) - len(kept)
        return kept

    def __getattr__(self, name: str) -> object:
        return getattr(self._session, name)


async def test_a_flush_whose_confirmation_was_lost_is_asked_for_again(tmp_path: Path) -> None:
    """At 32 nodes flushes went unconfirmed and their ranges were read from the origin
    again: an alert libtorrent drops is never posted, so a flush asked for once and
    waited on stays unconfirmed however long the wait. Asked again, it is confirmed."""
    seeder, leecher, data, torrent = await _pair(tmp_path, 3.0)
    loses = _LosesAFlush(leecher._session)
    try:
        download = await leecher.download(torrent, tmp_path / "in", [("127.0.0.93", seeder.port)])
        await _all_had(leecher, torrent)
        leecher._session = loses  # type: ignore[assignment]
        await download.wait_range(0, SIZE)  # not SwarmUnflushed after 3 s
        assert loses.lost >= 1  # the first confirmation was lost
        assert (tmp_path / "in" / "model.safetensors").read_bytes() == data.read_bytes()
        await download.aclose()
    finally:
        leecher._session = loses._session  # type: ignore[assignment]
        await leecher.aclose()
        await seeder.aclose()


class _Counted:
    """A torrent handle whose status calls and dials of a peer are counted."""

    def __init__(self, handle: object) -> None:
        self._handle = handle
        self.statuses = self.dials = 0

    def status(self, *args: object) -> object:
        self.statuses += 1
        return self._handle.status(*args)  # type: ignore[attr-defined]

    def connect_peer(self, *args: object) -> None:
        self.dials += 1
        self._handle.connect_peer(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._handle, name)


async def test_downloads_waiting_at_once_look_through_one_shared_read(tmp_path: Path) -> None:
    """Each download looked at its torrent itself, in the session's one lane, 20 times
    a second: a follower of a file's 31 ranges made 620 calls a second into its lane
    at 32 nodes, on a rig whose two cores ran out first. Their looks are the session's
    shared read of the alerts now, one call for every torrent of the node."""
    seeder, leecher, _, _ = await _pair(tmp_path, 30.0)
    try:
        sent = []
        for i in range(4):
            path = tmp_path / "seed" / f"f{i}"
            path.write_bytes(os.urandom(1 << 20))
            torrent = await asyncio.to_thread(make_torrent, path, f"f{i}")
            await seeder.seed(torrent, path)
            sent.append((torrent, path))
        downloads = [
            await leecher.download(t, tmp_path / f"in{i}", [("127.0.0.93", seeder.port)])
            for i, (t, _) in enumerate(sent)
        ]
        handles = [d.handle for d in downloads]
        counted = [_Counted(h) for h in handles]
        withheld = _Withheld(leecher._session)
        leecher._session = withheld  # type: ignore[assignment]
        for download, handle in zip(downloads, counted, strict=True):
            download.handle = handle  # type: ignore[assignment]
        async with asyncio.timeout(60):
            await asyncio.gather(*(d.wait_range(0, 1 << 20) for d in downloads))
        leecher._session = withheld._session  # type: ignore[assignment]
        for download, handle in zip(downloads, handles, strict=True):
            download.handle = handle
        assert [c.statuses for c in counted] == [0, 0, 0, 0]  # no look of its own
        assert withheld.reads >= 1
        for (_, path), i in zip(sent, range(4), strict=True):
            assert (tmp_path / f"in{i}" / f"f{i}").read_bytes() == path.read_bytes()
        for download in downloads:
            await download.aclose()
    finally:
        await leecher.aclose()
        await seeder.aclose()


async def test_downloads_missing_peers_dial_them_again_within_the_shared_reads(
    tmp_path: Path,
) -> None:
    """A download with peers not connected dials them again every 2 s; each made a call
    into the session's lane of its own for it: 31 downloads of a node of 32, every 2 s,
    and on two busy CPUs each call wakes a thread (the loop's costliest line in a
    profile at 32 nodes). The dials ride on the shared reads of the alerts now."""
    data = tmp_path / "data"
    data.write_bytes(os.urandom(1 << 20))
    leecher = Swarm("127.0.0.95", 0, stall=60)
    lane = leecher.lane = CountedLane("swarm", 1)
    await leecher.start()
    try:
        handles, downloads = [], []
        for i in range(4):
            torrent = await asyncio.to_thread(make_torrent, data, f"f{i}")
            nobody = [("127.0.0.96", 9), ("127.0.0.97", 9)]  # nothing listens: refused
            download = await leecher.download(torrent, tmp_path / f"in{i}", nobody)
            handles.append(_Counted(download.handle))
            download.handle = handles[-1]  # type: ignore[assignment]
            downloads.append(download)
        withheld = _Withheld(leecher._session)
        leecher._session = withheld  # type: ignore[assignment]
        calls = lane.calls
        waits = [asyncio.create_task(d.wait_range(0, 1 << 20)) for d in downloads]
        await asyncio.sleep(5.0)
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        made, reads = lane.calls - calls, withheld.reads
        leecher._session = withheld._session  # type: ignore[assignment]
        assert all(h.dials >= 4 for h in handles), [h.dials for h in handles]  # 2 peers, twice
        assert made <= reads + 1, (made, reads)  # no call of a download's own
        for download in downloads:
            await download.aclose()
    finally:
        await leecher.aclose()


# -- what a read of the alerts asks of libtorrent ----------------------------------------


class _NoUpdates:
    """A libtorrent session whose answers to ``post_torrent_updates`` are lost."""

    def __init__(self, session: object) -> None:
        self._session = session

    def pop_alerts(self) -> list[object]:
        found = self._session.pop_alerts()  # type: ignore[attr-defined]
        return [a for a in found if not isinstance(a, lt.state_update_alert)]

    def __getattr__(self, name: str) -> object:
        return getattr(self._session, name)


def _seeding(tmp_path: Path, count: int) -> tuple[object, list[tuple[str, _Counted]], list[int]]:
    """A bare libtorrent session seeding ``count`` files of different sizes."""
    session = lt.session(settings_pack("127.0.0.95", 0, 0), 0)
    handles, sizes = [], []
    for i in range(count):
        folder = tmp_path / f"seed{i}"
        folder.mkdir()
        data = folder / "model.safetensors"
        data.write_bytes(os.urandom(SIZE // 4 + i * 4096))
        torrent = make_torrent(data, "model.safetensors")
        params = lt.add_torrent_params()
        params.ti = lt.torrent_info(torrent)
        params.save_path = str(folder)
        handles.append((info_hash(torrent), _Counted(session.add_torrent(params))))
        sizes.append(data.stat().st_size)
    return session, handles, sizes


def test_a_read_of_the_alerts_asks_libtorrent_once_not_each_torrent(tmp_path: Path) -> None:
    """Each read asked every torrent held for its status: at 32 nodes on one file, 62
    torrents a node, 1 to 2.5 ms of CPU a read, four reads a second on each of 32
    daemons sharing two vCPUs. One ``post_torrent_updates`` now answers for all; a
    torrent unchanged since the last read keeps the counts it had."""
    session, handles, sizes = _seeding(tmp_path, 8)
    try:
        found = alerts.read(session, handles, {})  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while any(c.done < s for c, s in zip(found.counts.values(), sizes, strict=True)):
            assert time.monotonic() < deadline, found.counts
            time.sleep(0.05)
            found = alerts.read(session, handles, found.counts)  # type: ignore[arg-type]
        again = alerts.read(session, handles, found.counts)  # type: ignore[arg-type]
        assert [h.statuses for _, h in handles] == [0] * len(handles)
        for (key, _), size in zip(handles, sizes, strict=True):
            assert again.counts[key].done == again.counts[key].wanted == size
            assert again.counts[key].pieces and all(again.counts[key].pieces)
    finally:
        session.pause()  # type: ignore[attr-defined]


def test_a_read_whose_statuses_never_come_asks_each_torrent(tmp_path: Path) -> None:
    """libtorrent drops alerts its queue has no room for: a read that gets no answer to
    its post within half a second asks every torrent itself, and its counts are true."""
    session, handles, sizes = _seeding(tmp_path, 3)
    lossy = _NoUpdates(session)
    try:
        deadline = time.monotonic() + 30
        while True:
            begun = time.monotonic()
            found = alerts.read(lossy, handles, {})  # type: ignore[arg-type]
            assert 0.4 < time.monotonic() - begun < 5
            if all(c.done == s for c, s in zip(found.counts.values(), sizes, strict=True)):
                break
            assert time.monotonic() < deadline, found.counts
        assert all(h.statuses > 0 for _, h in handles)
    finally:
        session.pause()  # type: ignore[attr-defined]
