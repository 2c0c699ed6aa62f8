"""``Swarm``: the daemon's one libtorrent session, driven from one thread lane.

Every libtorrent call runs in the lane ``swarm`` (one thread: the calls are ordered
and the event loop never blocks on them). The session is private: no DHT, local
service discovery, UPnP, NAT-PMP or peer exchange (only the smart-ban plugin, which
bans a peer whose data failed a piece's hash), and no µTP (it held peers to a few
MB/s): TCP only. An IP filter lets in only the configured peers (``allow``), for
connections either way.

Pieces are libtorrent's to move and check: a v2 torrent checks each piece against
its merkle tree on arrival. A ``Download`` (download.py) says when a byte range is
whole on disk, or that the swarm stalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import StartupError
from ..redact import redacting_logger
from ..runtime.tasks import Shared
from ..runtime.threads import Lane, run_blocking
from . import alerts
from .alerts import SwarmStatistics
from .deal import share_first
from .download import Download, SwarmError, SwarmStalled
from .libtorrent_types import AddTorrentParams, Session, TorrentHandle
from .range_torrents import add_params
from .settings_pack import settings_pack
from .torrents import describe, info_hash, libtorrent

__all__ = ["Swarm", "SwarmError", "SwarmStalled", "SwarmStatistics"]

logger = redacting_logger(__name__)

_PUMP = 0.25  # seconds between reads of the session's alerts
READ_GAP = 0.25  # seconds between two reads' starts at the least (swarm.md: 5-6 % CPU)


class Swarm:
    """One libtorrent session listening on ``host:port``.

    Args:
        stall: seconds with no block arriving here before a download is ``SwarmStalled``.
        rate: bytes per second the session sends and takes (0: no cap).

    ``await start()``, then ``seed``/``download``; ``aclose`` removes every torrent and
    stops the session. Use ``async with``.

    The torrents held (``_handles``, ``_seeds``) are the event loop's: only it reads or
    changes them; a call in the lane is handed what it needs (the alerts' reader, a
    snapshot of the handles; an add, the handle it replaces) and returns what it made.
    """

    def __init__(self, host: str, port: int, *, stall: float = 30.0, rate: int = 0) -> None:
        self.host, self.port, self.stall, self.rate = host, port, stall, rate
        self.lane = Lane("swarm", 1)
        self._session: Session | None = None
        self._handles: dict[str, TorrentHandle] = {}
        self._seeds: dict[str, Path] = {}  # info hash -> the file seeded (``seed``)
        self._pump: asyncio.Task[None] | None = None
        self._counts: dict[str, alerts.TorrentCounts] = {}
        self._banned = self._blocked = self._failures = 0
        self._allowed: list[str] = []
        self._reads = Shared(self._read_alerts)  # refresh() and the pump share reads
        self._dials: list[Callable[[], object]] = []  # made in the lane with the next read
        self._read_at = float("-inf")  # when the last read began (loop time)
        self.flushes: set[str] = set()  # info hashes whose writes libtorrent flushed
        self.arrived = 0.0  # monotonic time a block of a download last arrived (download.py)
        self.failed: dict[str, OSError] = {}  # info hash -> its file's error (alerts.py)

    def __repr__(self) -> str:
        return f"<Swarm {self.host}:{self.port} torrents={len(self._handles)}>"

    async def __aenter__(self) -> Swarm:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the session and listen.

        Raises:
            StartupError: libtorrent is missing, or the address cannot be listened on.
        """
        try:
            await run_blocking(self.lane, self._open)
        except StartupError:
            self.lane.close()
            raise
        self._pump = asyncio.get_running_loop().create_task(
            self._pumping(), name="aioloader swarm alerts"
        )

    def _open(self) -> None:
        lt = libtorrent()
        session = lt.session(settings_pack(self.host, self.port, self.rate), 0)  # no plugins
        session.add_extension("smart_ban")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            session.wait_for_alert(100)
            for alert in session.pop_alerts():
                if isinstance(alert, lt.listen_failed_alert):
                    raise StartupError(
                        f"the swarm cannot listen on {self.host}:{self.port}: "
                        f"{alert.message()}; pick another --swarm-port / AIOLOADER_SWARM_PORT"
                    )
                if isinstance(alert, lt.listen_succeeded_alert) and alert.socket_type in (
                    lt.socket_type_t.tcp,
                    lt.socket_type_t.tcp_ssl,
                ):
                    self._session = session
                    self.port = int(alert.port)  # with port 0, µTP's socket has its own
                    self._filter(session)
                    return
        raise StartupError(f"the swarm did not start listening on {self.host}:{self.port}")

    def _filter(self, session: Session) -> None:
        lt = libtorrent()
        rules = lt.ip_filter()
        rules.add_rule("0.0.0.0", "255.255.255.255", 1)
        rules.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1)
        for ip in {*self._allowed, self.host}:
            if ip not in ("0.0.0.0", "::"):
                rules.add_rule(ip, ip, 0)
        session.set_ip_filter(rules)

    async def allow(self, ips: Iterable[str]) -> None:
        """Let only these addresses (and this node's own) connect, either way."""
        self._allowed = sorted(set(ips))
        session = self._session
        if session is not None:  # else: applied once it listens (``start``)
            await run_blocking(self.lane, lambda: self._filter(session))

    @staticmethod
    def _remove(session: Session, key: str, handle: TorrentHandle) -> None:
        """Take a torrent out and wait until it is gone (its writes ended: libtorrent
        lets a torrent go once its storage stopped)."""
        session.remove_torrent(handle)
        deadline = time.monotonic() + 10
        while handle.is_valid():
            if time.monotonic() > deadline:
                raise SwarmError(f"swarm torrent {key[:12]}: not removed within 10 s")
            time.sleep(0.005)

    async def _added(
        self, torrent: bytes, add: Callable[[TorrentHandle | None], TorrentHandle]
    ) -> TorrentHandle:
        """Run ``add`` in the lane, handed the torrent's handle it replaces (if any), and
        hold the handle it returns (one added by a call abandoned meanwhile too: the
        session has it)."""
        key = info_hash(torrent)
        old = self._handles.pop(key, None)
        self._seeds.pop(key, None)
        self.failed.pop(key, None)

        def hold(handle: TorrentHandle) -> None:
            self._handles[key] = handle

        handle = await run_blocking(self.lane, lambda: add(old), on_abandon=hold)
        hold(handle)
        return handle

    def _add(
        self,
        session: Session,
        old: TorrentHandle | None,
        torrent: bytes,
        folder: Path,
        name: str | None,
        seed: bool,
    ) -> TorrentHandle:
        lt = libtorrent()
        params = lt.add_torrent_params()
        params.ti = lt.torrent_info(torrent)
        params.save_path = str(folder)
        flags = lt.torrent_flags.default_flags & ~lt.torrent_flags.auto_managed
        flags |= lt.torrent_flags.duplicate_is_error
        if name is not None:
            params.renamed_files = {0: name}
        if seed:
            flags |= lt.torrent_flags.seed_mode
        elif name is not None:
            # A named file to fetch is the caller's (a cache entry's, made and sized):
            # none of its pieces is there yet, and hashing it to find out reads it whole.
            flags |= lt.torrent_flags.no_verify_files
        params.flags = flags
        return self._put(session, old, torrent, params)

    def _put(
        self, session: Session, old: TorrentHandle | None, torrent: bytes, params: AddTorrentParams
    ) -> TorrentHandle:
        """Add ``torrent`` with ``params``, in place of ``old`` (if any)."""
        if old is not None:
            # Removal is asynchronous: a torrent added again before it is gone would get
            # the old, dying handle back (and "invalid torrent handle" on its next use).
            self._remove(session, info_hash(torrent), old)
        handle = session.add_torrent(params)
        handle.resume()  # not auto-managed: nothing else would start it
        return handle

    async def seed(self, torrent: bytes, path: Path) -> None:
        """Offer the file at ``path`` (checked already: its cache entry) as ``torrent``;
        a download of the same torrent is replaced."""
        session = self._open_session()
        await self._added(
            torrent, lambda old: self._add(session, old, torrent, path.parent, path.name, True)
        )
        self._seeds[info_hash(torrent)] = path

    async def download(
        self,
        torrent: bytes,
        folder: Path,
        peers: Iterable[tuple[str, int]],
        share: tuple[int, int] | None = None,
        into: Path | None = None,
    ) -> Download:
        """Start fetching ``torrent`` into ``folder`` from ``peers`` (swarm addresses).

        ``into``: write the file there instead (a cache entry's ``data.partial``, made
        and sized by its holder); no piece of it is taken for had.

        ``share``: ``(i, n)``, this node is the i-th of n fetching the file at once: it
        asks for the i-th n-th of the pieces first. Every peer holds the file's pieces
        from the node that pulls it from the origin only; were every node to ask it
        for the same pieces, it would send those several times, and the file would
        leave it more slowly: a share each, traded among the followers, makes its
        upload count once (8 nodes, 40 MB/s links: 256 MiB in 10.5 s, 14 s without).
        """
        session = self._open_session()
        key = info_hash(torrent)
        seeded = self._seeds.get(key) if into is None else None
        if seeded is not None:
            # This node holds the file already (a fetch tried again follows a node for a
            # file it has since committed): read it where it is seeded, whose pieces are
            # all had; downloading it would replace the seed, and two nodes doing so would
            # each wait for the other.
            return Download(self, self._handles[key], torrent, seeded, owned=False)
        path = folder / describe(torrent)[0] if into is None else into

        def add(old: TorrentHandle | None) -> TorrentHandle:
            name = None if into is None else path.name
            handle = self._add(session, old, torrent, path.parent, name, False)
            if share is not None:
                handle.prioritize_pieces(share_first(handle.torrent_file().num_pieces(), *share))
            return handle

        handle = await self._added(torrent, add)
        download = Download(self, handle, torrent, path)
        download.connect(peers)
        await download.dial()  # connects now
        return download

    async def seed_range(self, torrent: bytes, path: Path) -> None:
        """Offer the range of a range torrent (range_torrents.py) from the partial file
        ``path``, which holds it written and is sized to the whole file; nothing else of
        the file is read or written. A download of the same torrent is replaced.

        Raises:
            RangeError: not a range torrent, or ``path`` is not its file's size.
        """
        session = self._open_session()
        params = await run_blocking(self.lane, lambda: add_params(torrent, path, seed=True))
        await self._added(torrent, lambda old: self._put(session, old, torrent, params))
        self._seeds[info_hash(torrent)] = path

    async def download_range(
        self, torrent: bytes, into: Path, peers: Iterable[tuple[str, int]]
    ) -> Download:
        """Start fetching the range of a range torrent (range_torrents.py; its info dict
        alone will do: the hashes come from the peers) into the partial file ``into``,
        made and sized to the whole file by its holder, at the range's offset; nothing
        else of the file is written. ``wait_range(offset, offset + length)`` says when
        it is on disk.

        Raises:
            RangeError: not a range torrent, or ``into`` is not its file's size.
        """
        session = self._open_session()
        key = info_hash(torrent)
        seeded = self._seeds.get(key)
        if seeded is not None:  # held already, as ``download`` says
            return Download(self, self._handles[key], torrent, seeded, owned=False)
        params = await run_blocking(self.lane, lambda: add_params(torrent, into, seed=False))
        handle = await self._added(torrent, lambda old: self._put(session, old, torrent, params))
        download = Download(self, handle, torrent, into)
        download.connect(peers)
        await download.dial()  # connects now
        return download

    def seeding(self, key: str) -> bool:
        return key in self._handles

    async def remove(self, key: str) -> None:
        """Stop offering or fetching the torrent of info hash ``key`` (if any)."""
        handle = self._handles.get(key)
        if handle is not None:
            await self.drop(key, handle)

    async def drop(self, key: str, handle: TorrentHandle) -> None:
        """Take the torrent ``key`` out, if ``handle`` is still the one held for it;
        returns once it is gone (it writes nothing more)."""
        session = self._session
        if self._handles.get(key) is not handle or session is None:
            return  # replaced (by a seed of the same file) or gone
        del self._handles[key]
        self._seeds.pop(key, None)
        self.failed.pop(key, None)
        await run_blocking(self.lane, lambda: self._remove(session, key, handle))

    def _open_session(self) -> Session:
        if self._session is None:
            raise SwarmError("the swarm is closed")
        return self._session

    async def _read_alerts(self) -> None:
        """Read the session's alerts and the held torrents' counts, in the lane: handed
        the handles as they are now (the loop's dict changes while the lane reads; a
        handle dropped after this snapshot leaves the session after it, in the lane)."""
        now = asyncio.get_running_loop().time
        await asyncio.sleep(max(0.0, self._read_at + READ_GAP - now()))  # (shared: Shared)
        self._read_at = now()
        session = self._open_session()
        handles, known = list(self._handles.items()), self._counts
        dials, self._dials = self._dials, []
        found = await run_blocking(self.lane, lambda: alerts.read(session, handles, known, dials))
        self._counts = found.counts
        self._banned += found.banned
        self._blocked += found.blocked
        self._failures += found.hash_failures
        self.flushes |= found.flushed
        for key, error in found.failed.items():
            if key in self._handles and key not in self.failed:
                logger.error("swarm: torrent %s: its file failed on this node: %s", key[:12], error)
                self.failed[key] = error

    def redial(self, connect: Callable[[], object]) -> None:
        """``connect`` called in the lane with the next read, 0.25 s away at most."""
        self._dials.append(connect)

    async def _pumping(self) -> None:
        while True:
            await self._reads()
            await asyncio.sleep(_PUMP)

    async def refresh(self) -> SwarmStatistics:
        """Read the session's alerts now (a read begun after the call, shared with
        every caller meanwhile: 31 downloads at 32 nodes, each waiting for a flush and
        asking for a read of every held torrent's status each 50 ms, held the lane so
        long that flushes went unconfirmed for 30 s); the statistics after them."""
        if self._session is not None:
            await self._reads()
        return self.statistics()

    def counts(self, key: str) -> alerts.TorrentCounts | None:
        """The torrent ``key``'s status as the last read of the alerts found it (a
        quarter of a second old at most), or None when it is not held."""
        return self._counts.get(key) if key in self._handles else None

    def statistics(self) -> SwarmStatistics:
        counts = self._counts
        return SwarmStatistics(
            {k: c.downloaded for k, c in counts.items()},
            {k: c.uploaded for k, c in counts.items()},
            self._banned,
            self._blocked,
            self._failures,
        )

    async def aclose(self) -> None:
        """Remove every torrent and stop the session; idempotent."""
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None
        held: list[Session] = [] if self._session is None else [self._session]
        self._session = None
        self._handles.clear()
        self._seeds.clear()
        try:
            if held:

                def stop() -> None:
                    session = held.pop()
                    session.pause()
                    for handle in session.get_torrents():
                        session.remove_torrent(handle)
                    del session  # its destructor waits for libtorrent's threads: here

                await run_blocking(self.lane, stop)
        finally:
            self.lane.close()
