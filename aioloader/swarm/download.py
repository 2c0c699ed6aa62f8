"""``Download``: one file coming from the swarm, and when its byte ranges are readable.

Its pieces are libtorrent's to move and check (a v2 torrent checks each piece against
its merkle tree on arrival); this says when a range is whole on disk (``wait_range``),
that the swarm stalled (``SwarmStalled``: no block of it, nor of any other download of
the node, for the stall time) so that its reader can turn elsewhere, or
that libtorrent could not write the file (an ``OSError``: this node's disk, nobody
else's).
Every libtorrent call runs in the session's lane (session.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from ..errors import SourceError
from ..runtime.threads import Lane, run_blocking
from .alerts import TorrentCounts
from .libtorrent_types import TorrentHandle
from .torrents import describe, info_hash, piece_length

__all__ = ["Download", "Host", "SwarmError", "SwarmStalled", "SwarmUnflushed"]

_POLL = 0.05  # seconds between looks at a download's pieces
_RECONNECT = 2.0  # seconds between connection attempts to peers a download lacks
_REFLUSH = 1.0  # seconds between asks for a flush libtorrent has not confirmed


class SwarmError(SourceError):
    """The swarm cannot give a file (a torrent error, a closed session, the node it
    follows gone): the file comes another way on the next try."""


class SwarmStalled(SwarmError, TimeoutError):
    """No block of a download, nor of any other download of the node, arrived for the
    stall time."""


class SwarmUnflushed(SwarmStalled):
    """libtorrent did not confirm this node's writes of a download within the stall
    time: the bytes came and passed their hashes, so the peers that sent them are not
    to blame; this node's disk or its swarm lane fell behind."""


class Host(Protocol):
    """What a download needs of its session (session.py's ``Swarm``)."""

    lane: Lane
    stall: float
    flushes: set[str]  # info hashes whose writes libtorrent flushed since asked
    arrived: float  # monotonic time a piece of any download here last arrived

    @property
    def failed(self) -> Mapping[str, OSError]:
        """Info hash -> the error libtorrent met writing (or reading) its file."""

    async def refresh(self) -> object:
        """Read the session's alerts now."""

    def counts(self, key: str) -> TorrentCounts | None:
        """The torrent ``key``'s status as the last read found it; None: not held."""

    async def drop(self, key: str, handle: TorrentHandle) -> None:
        """Take the torrent ``key`` out, if ``handle`` is still the one held for it."""

    def redial(self, connect: Callable[[], object]) -> None:
        """Have ``connect`` called in the lane with the next read of the alerts."""


class Download:
    """One file coming from the swarm into ``path``."""

    def __init__(
        self, swarm: Host, handle: TorrentHandle, torrent: bytes, path: Path, owned: bool = True
    ) -> None:
        self.swarm = swarm
        self.owned = owned  # False: the session's seed of the file, left to it at ``aclose``
        self.handle = handle
        self.info_hash = info_hash(torrent)
        self.path = path
        self.size = describe(torrent)[1]
        self._piece = piece_length(torrent)
        self._have: list[bool] = []
        self._done = -1
        self._moved = time.monotonic()
        self._looked = 0.0
        self._connected = 0.0
        self._peers: list[tuple[str, int]] = []
        self._connected_peers = 0  # as last looked at
        self._lock = asyncio.Lock()
        self.bytes_from_peers = 0
        self.progress = 0.0
        self._flushed: list[bool] = []  # the pieces had when the last flush began
        self._flushing = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<Download {self.info_hash[:12]} {self.progress:.0%}>"

    @property
    def done(self) -> int:
        """Bytes of the wanted pieces checked here, as last looked at."""
        return max(self._done, 0)

    def connect(self, peers: Iterable[tuple[str, int]]) -> None:
        """Peers to try (their swarm addresses); tried again while some are not connected."""
        self._peers = list(dict.fromkeys([*self._peers, *peers]))
        self._connected = 0.0

    async def dial(self) -> None:
        """Dial the peers now (in the lane); again in ``_RECONNECT`` s while some lack."""
        self._connected = time.monotonic()
        await run_blocking(self.swarm.lane, self._connect)

    def _connect(self) -> None:
        """In the lane: dial the peers not connected."""
        handle = self.handle
        for peer in self._peers:
            with contextlib.suppress(RuntimeError):
                handle.connect_peer(peer)

    async def _status(self) -> TorrentCounts:
        """The torrent's status from a read of the session's alerts begun after the ask:
        one read, in the lane, for every download of the node that asks meanwhile (at 32
        nodes a follower's 31 downloads each looked in the lane 20 times a second)."""
        await self.swarm.refresh()
        status = self.swarm.counts(self.info_hash)
        if status is None:
            raise SwarmError(f"swarm download {self.info_hash[:12]}: taken out of the session")
        return status

    async def _refresh(self, stall: float) -> None:
        async with self._lock:
            if time.monotonic() - self._looked < _POLL:
                return
            status = await self._status()
            self._looked = now = time.monotonic()
            # Peers not yet holding the torrent refuse at first; ask again until all are in.
            self._connected_peers = status.peers
            if status.peers < len(self._peers) and now - self._connected > _RECONNECT:
                # Dialled with the next read, not in a lane call of its own: 31 downloads
                # of a node of 32 each crossing to the lane every 2 s cost the loop more
                # than the rest of what it did (each hop wakes a thread on busy CPUs).
                self._connected = now
                self.swarm.redial(self._connect)
            self._check_writes()
            if status.error:
                raise SwarmError(f"swarm download {self.info_hash[:12]} failed: {status.error}")
            # Blocks count, not whole pieces alone: a range torrent's 1 MiB piece, its
            # owner's uplink shared with 30 followers, takes longer than the stall time.
            # And a download waiting its turn while others arrive is not stalled: at 32
            # nodes on 2 MB/s links, a follower of a file's 31 ranges took such ranges
            # for stalled owners and dropped them; the file left the origin 17.7 times.
            done, down = status.done, status.downloaded
            moved = done != self._done or down != self.bytes_from_peers
            self._have, self.bytes_from_peers = list(status.pieces), down
            self.progress = done / self.size if self.size else 1.0
            now = time.monotonic()
            if moved:
                self._done, self._moved = done, now
                self.swarm.arrived = max(self.swarm.arrived, now)
            elif done < status.wanted and now - max(self._moved, self.swarm.arrived) > stall:
                # (all it wants had, only its writes are awaited: ``_flush`` bounds that)
                raise SwarmStalled(
                    f"swarm download {self.info_hash[:12]}: no block here for {stall:g} s "
                    f"({self.progress:.0%} done, {self._connected_peers} of "
                    f"{len(self._peers)} peers connected)"
                )

    def _check_writes(self) -> None:
        """Raise the error libtorrent met writing the file, if it met one: the pieces
        whose writes failed count as had all the same (alerts.py)."""
        failed = self.swarm.failed.get(self.info_hash)
        if failed is not None:
            raise failed

    async def wait_range(self, start: int, end: int) -> None:
        """Return once bytes ``[start, end)`` are checked and on disk.

        libtorrent 2.1 counts a piece as had once its hash passed, which may be before
        its bytes left its write buffer; so a range is readable once its pieces are had
        and a flush begun after that ended (cache_flushed_alert). Waiting ranges share
        the flushes: one at a time, each covering every piece had when it began.

        Raises:
            SwarmStalled: no block arrived here for the swarm's stall time.
            SwarmError: libtorrent reports an error on the torrent.
            OSError: libtorrent could not write the file (this node's disk: full, over
                a size limit, failing, read-only).
        """
        end = min(end, self.size)
        if end <= start:
            return
        while not self._holds(self._flushed, start, end):
            await self._refresh(self.swarm.stall)
            if self._holds(self._have, start, end):
                await self._flush()
            else:
                await asyncio.sleep(_POLL)

    def _holds(self, pieces: list[bool], start: int, end: int) -> bool:
        if not pieces:
            return False
        first, last = start // self._piece, (end - 1) // self._piece
        return all(pieces[first : last + 1])

    async def _flush(self) -> None:
        """Flush libtorrent's writes of this torrent; ``_flushed``: what was had before."""
        async with self._flushing:
            swarm = self.swarm
            have = list((await self._status()).pieces)
            if have == self._flushed:
                return  # nothing new since the last flush
            swarm.flushes.discard(self.info_hash)
            wait = max(swarm.stall, 1.0)
            try:
                async with asyncio.timeout(wait):
                    while self.info_hash not in swarm.flushes:
                        # Asked again each second: libtorrent drops alerts its queue
                        # has no room for, and a flush whose alert was dropped would
                        # never be confirmed (the range read again from the origin).
                        await run_blocking(swarm.lane, self.handle.flush_cache)
                        asked = time.monotonic()
                        while (
                            self.info_hash not in swarm.flushes
                            and time.monotonic() - asked < _REFLUSH
                        ):
                            await asyncio.sleep(_POLL)
                            await swarm.refresh()
            except TimeoutError:  # a bare one read as this cache's disk failing
                raise SwarmUnflushed(
                    f"swarm download {self.info_hash[:12]}: libtorrent did not confirm "
                    f"its writes within {wait:g} s"
                ) from None
            self._check_writes()  # a write that failed is reported before the flush ends
            self._flushed = have

    async def aclose(self) -> None:
        """Take the download out of the session (its file stays; idempotent)."""
        if self.owned:
            await self.swarm.drop(self.info_hash, self.handle)
