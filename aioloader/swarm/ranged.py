"""A large file of a cold split, assembled from byte ranges (``Ranged``: a ``Delivery``).

Every puller of the split reads its own ranges of the file (ranges.py) from the origin
straight into the cache entry's partial file (``landing``: made and sized by the
fetch), in reads of ``CHUNK`` bytes at most, hashes each range as a range torrent
(range_torrents.py, in a thread) and seeds it from that file at once, listing it in
its manifest; it downloads every other range from its puller into the same file at
the range's offset (``Swarm.download_range``, from the range torrent's info dict,
fetched by its info hash and checked against the range offered). So each byte is
written once, and the fetch takes each range as soon as it is written or checked
(``arrived``). Where the origin publishes a digest of the file, the whole file is
hashed once every range is in (``verified``).

A puller that goes away (the followed node's watch) or stalls costs the ranges it had
not published to this node: they are dealt again among the pullers left (``owner``,
alike on every node), and where this node is a range's new owner and holds it already
(downloaded before its puller went), it publishes it without reading the origin.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path

from ..cache.supply import Arrival, Delivery
from ..errors import DigestMismatchError
from ..redact import redacting_logger
from ..runtime.threads import run_blocking
from ..sources.base import Current, Source
from ..sources.digests import Digest
from .counts import Reads
from .download import Download, SwarmError, SwarmStalled, SwarmUnflushed
from .followed import Followed, NotListed, TorrentLate
from .manifest import FileOffer, torrent_name
from .pulling import OriginFile, pull, whole_digest
from .range_torrents import has_layers, make_range_torrent, served
from .ranges import PIECE, RangeOffer, adopted, owner, spans
from .scratch import linked, unlinked
from .session import Swarm
from .splits import Split
from .torrents import info_hash
from .view import RangeView

__all__ = ["Ranged", "Split"]

logger = redacting_logger(__name__)

_ADOPT = 0.5  # seconds between looks for pullers gone


class Ranged(Delivery):
    """The file ``name`` (at ``url``, the origin's ``current`` version), from its
    ranges: this node's read from ``origin``, the others' downloaded from their pullers.

    Args:
        split: the pullers and the nodes followed.
        swarm: the daemon's session.
        lane: threads for writes and hashes.
        noted: shows the file's offer (its ranges) in this node's manifest.
        digest: what the origin publishes of the file (None: nothing to compare).
    """

    def __init__(
        self,
        split: Split,
        swarm: Swarm,
        lane: Executor,
        origin: Source,
        url: str,
        name: str,
        current: Current,
        reads: Reads,
        noted: Callable[[FileOffer], None],
        digest: Digest | None,
        scratch: Path,
    ) -> None:
        self.origin = OriginFile(origin, url, name, current, reads)
        super().__init__(self.origin)
        self.split, self.swarm, self.lane = split, swarm, lane
        self.url, self.name, self.size = url, name, current.size
        self.reads, self.noted, self.digest, self.scratch = reads, noted, digest, scratch
        self.spans = spans(self.size, split.cuts or len(split.pullers))
        self._start = split.start(name)
        listed = split.listing(name, self.size).spans()
        if listed and not listed <= set(self.spans):  # it joins a split under way
            self.spans = adopted(sorted(listed), self.size)
        loop = asyncio.get_running_loop()
        self._written = [loop.create_future() for _ in self.spans]
        self._mine: dict[int, bytes] = {}  # range -> its torrent, seeded here
        self._held: dict[int, bytes] = {}  # range -> its torrent, downloaded whole here
        self._downloads: dict[int, Download] = {}
        self._pulling: set[int] = set()  # ranges read from the origin here
        self._delivered: set[str] = set()  # the nodes a range came from whole
        self._tasks: list[asyncio.Task[None]] = []
        self._path: Path | None = None  # a link to the entry's partial file (scratch.py)
        self._partial: Path | None = None
        self._committed = False
        self.offer = FileOffer(name, url, self.size, current.etag, current.last_modified)

    def __repr__(self) -> str:
        return f"<Ranged {self.name}: {len(self.spans)} ranges>"

    def _what(self, i: int) -> str:
        offset, length = self.spans[i]
        return f"{self.url}: range [{offset}, {offset + length})"

    def owner(self, i: int) -> str:
        """The node range ``i`` comes from: a node alive that lists it as its puller, else
        the deal's owner where it holds it or nobody does, else a node that holds it."""
        split, span = self.split, self.spans[i]
        listing = split.listing(self.name, self.size)
        pulled = listing.pulled.get(span)
        if pulled is not None:
            return pulled
        gone = split.gone()
        dealt = owner(split.key, self.name, len(self.spans), i, split.pullers, gone, self._start)
        held = listing.holder(span, i, dealt)
        return dealt if held is None else held

    def _unheard(self, i: int) -> bool:
        """Whether range ``i``'s first puller is one this node gave up unheard (others
        may hear it, and download the range from it)."""
        split = self.split
        first = owner(split.key, self.name, len(self.spans), i, split.pullers, set(), self._start)
        return first in split.hearing.given_up

    def roles(self) -> tuple[RangeView, ...]:
        """How each range comes here, for the cluster's view (view.py)."""
        shown = {r.offset: r.done for r in self.offer.ranges}
        found = []
        for i, (offset, length) in enumerate(self.spans):
            written, who = self._written[i], self.owner(i) or None
            download = self._downloads.get(i)
            if written.done() and not written.cancelled() and written.exception() is None:
                found.append(RangeView(offset, length, length, "holds", who))
            elif i in self._pulling:
                found.append(RangeView(offset, length, shown.get(offset, 0), "origin", who))
            else:
                done = download.done if download is not None else 0
                found.append(RangeView(offset, length, min(done, length), "follows", who))
        return tuple(found)

    # -- the cache's seam ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def landing(self, path: Path) -> AsyncIterator[Arrival | None]:
        if self._path is not None:  # one landing a fetch
            yield None
            return
        self._partial = path
        self._path = await run_blocking(self.lane, lambda: linked(path, self.scratch))
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._range(i), name=f"aioloader {self._what(i)}")
            for i in range(len(self.spans))
        ]
        self._tasks.append(loop.create_task(self._adopting(), name=f"aioloader {self.name}"))
        for i, (offset, length) in enumerate(self.spans):  # listed at once: a node that
            if self.owner(i) == self.split.node:  # joins late follows them
                self._show(i, RangeOffer(offset, length))
        try:
            yield self
        except BaseException:
            await self._stop(unseed=True)
            raise

    async def arrived(self, start: int, end: int) -> None:
        """Arrival: bytes ``[start, end)`` are in the file, read or checked."""
        for i, (offset, length) in enumerate(self.spans):
            if offset < end and start < offset + length:
                await asyncio.shield(self._written[i])

    async def verified(self) -> None:
        """Arrival: the whole file matches the origin's digest (at once without one)."""
        digest, path = self.digest, self._path
        running = digest.running() if digest is not None else None
        if digest is None or running is None or path is None:
            return
        await asyncio.gather(*(asyncio.shield(w) for w in self._written))
        actual = await run_blocking(self.lane, lambda: whole_digest(path, self.size, running))
        if actual != digest.value:
            raise DigestMismatchError(
                f"{self.url}: the file assembled from its ranges does not match the "
                f"{digest.algorithm} {digest.where}: expected {digest.value}, got {actual}; "
                "the cache keeps none of it, and the next try reads it again",
                url=self.url, algorithm=digest.algorithm, expected=digest.value, actual=actual,
            )  # fmt: skip

    # -- one range -------------------------------------------------------------------------

    async def _range(self, i: int) -> None:
        future = self._written[i]
        try:
            while True:
                who = self.owner(i)
                follow = self.split.followed.get(who)
                if follow is None and who not in ("", self.split.node):
                    await asyncio.sleep(_ADOPT)  # its puller unheard yet, asked again
                    continue
                if follow is None:
                    if self._unheard(i) and await self._held_soon(i):
                        continue  # a node that heard its puller holds it: followed there
                    await self._pull(i)
                    break
                try:
                    await follow.unless_gone(self._fetch(i, follow))
                    break
                except NotListed as exc:  # it dealt this range to another node
                    if self.owner(i) != who:  # which lists it now: followed there
                        continue
                    logger.warning("%s: %s; read from the origin here", self._what(i), exc)
                    await self._pull(i)
                    break
                except SwarmError as exc:
                    if follow.gone is not None:  # the node itself went: dealt again
                        continue
                    if isinstance(exc, (SwarmUnflushed, TorrentLate)) or (
                        isinstance(exc, SwarmStalled) and follow.node in self._delivered
                    ):
                        # This range stalled, not the node (it served others, sent the
                        # range whole and this node's writes lagged, or it is alive and
                        # too busy to answer for its torrent): read it here. Dropping
                        # the node for one range had every node that saw a stall read
                        # all of its ranges from the origin (1.98x; at 32 nodes, 31
                        # flushes unconfirmed cost a one-file model 6.1x, 32 late torrent
                        # asks 28.6x).
                        logger.warning("%s from %r: %s; read from the origin here",
                                       self._what(i), follow, exc)  # fmt: skip
                        await self._drop(i)
                        await self._pull(i)
                        break
                    logger.warning("%s from %r failed: %s; dealt again", self._what(i), follow, exc)
                    follow.went(exc)
                    await self._drop(i)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(None)

    async def _drop(self, i: int) -> None:
        download = self._downloads.pop(i, None)
        if download is not None:
            await download.aclose()
            if i not in self._mine and i not in self._pulling:
                self._show(i, None)  # no longer coming from a peer: not offered

    async def _fetch(self, i: int, follow: Followed) -> None:
        offset, length = self.spans[i]
        path = self._path
        assert path is not None
        strict = not self.split.gone()  # else its listing may lag a range dealt again
        torrent = await follow.range_torrent(self.name, offset, length, self.size, strict)
        download = await self.swarm.download_range(torrent, path, follow.swarm_peers())
        self._downloads[i] = download
        if i not in self._mine:  # offered as it comes: a node deaf to its puller joins here
            self._show(i, RangeOffer(offset, length, 0, info_hash(torrent), None, torrent,
                                     held=True))  # fmt: skip
        await download.wait_range(offset, offset + length)
        self._delivered.add(follow.node)
        self.reads.from_peers(self.name, length)
        if i not in self._mine:  # offered too: a node that gave up its puller finds it
            self._held[i] = torrent
            seeded = torrent if has_layers(torrent) else None
            self._show(i, RangeOffer(offset, length, length, info_hash(torrent), seeded,
                                     torrent, held=True))  # fmt: skip

    async def _held_soon(self, i: int) -> bool:
        """Wait up to the stall time for a node alive to list range ``i`` (held, or as
        its puller); False where none does by then."""
        span, loop = self.spans[i], asyncio.get_running_loop()
        until = loop.time() + self.swarm.stall
        while loop.time() < until:
            listing = self.split.listing(self.name, self.size)
            if span in listing.held or span in listing.pulled:
                return True
            await asyncio.sleep(_ADOPT)
        return False

    async def _pull(self, i: int) -> None:
        """Read range ``i`` from the origin into the partial file; then publish it."""
        offset, length = self.spans[i]
        assert self._path is not None
        self._pulling.add(i)
        done = 0

        def progress(n: int) -> None:
            nonlocal done
            done += n
            self._show(i, RangeOffer(offset, length, done))

        await pull(self.origin, self._path, offset, length, self.lane, self.split.gate, progress)
        await self._publish(i)

    async def _publish(self, i: int) -> None:
        """Hash range ``i`` as written here, seed it, list it (a failure is logged: the
        others deal it again once they find this node stalled)."""
        offset, length = self.spans[i]
        path, name, size = self._path, torrent_name(self.name), self.size
        assert path is not None
        try:
            torrent = await run_blocking(
                self.lane, lambda: make_range_torrent(path, offset, length, size, name, PIECE)
            )
            given = await run_blocking(self.lane, lambda: served(torrent))
            await self.swarm.seed_range(torrent, path)
        except (OSError, ValueError, SwarmError) as exc:
            logger.warning("%s: not offered to peers: %s", self._what(i), exc)
            return
        self._mine[i] = torrent
        self._show(i, RangeOffer(offset, length, length, info_hash(torrent), torrent, given))

    def _show(self, i: int, one: RangeOffer | None) -> None:
        offset = self.spans[i][0]
        ranges = [r for r in self.offer.ranges if r.offset != offset]
        if one is not None:
            ranges.append(one)
        ranges.sort(key=lambda r: r.offset)
        done = sum(r.done for r in ranges)
        self.offer = replace(self.offer, ranges=tuple(ranges), done=min(done, self.size))
        self.noted(self.offer)

    async def _adopting(self) -> None:
        """Publish the ranges this node holds whose puller went and that fall to it now:
        the nodes that lack them follow it for them."""
        while True:
            await asyncio.sleep(_ADOPT)
            if not self.split.gone():
                continue
            for i, written in enumerate(self._written):
                if i in self._mine or not written.done() or written.cancelled():
                    continue
                if written.exception() is not None:
                    continue
                if self.owner(i) == self.split.node:
                    logger.info("%s: its puller went; offered from here", self._what(i))
                    await self._publish(i)

    # -- the end ---------------------------------------------------------------------------

    async def committed(self, data: Path) -> None:
        """The cache committed the file at ``data``: this node's ranges are seeded from
        there (a node still fetching one finds it), the downloads go."""
        self._committed = True
        await self._stop(unseed=False)
        for torrent in self._mine.values():
            try:
                await self.swarm.seed_range(torrent, data)
            except (OSError, ValueError, SwarmError) as exc:
                logger.warning("%s: a range no longer offered: %s", self.url, exc)
        for i, torrent in self._held.items():  # seeded from the entry too, where it can be
            try:
                if not has_layers(torrent):
                    raise SwarmError("its torrent came without its piece layers")
                await self.swarm.seed_range(torrent, data)
            except (OSError, ValueError, SwarmError) as exc:
                logger.info("%s: no longer offered: %s", self._what(i), exc)
                self._show(i, None)
        await self._unlink()
        await self.origin.aclose()

    async def aclose(self) -> None:
        """The fetch ended: what runs stops; ranges of a file not committed leave."""
        await self._stop(unseed=not self._committed)
        await self.origin.aclose()
        if not self._committed:
            await self._unlink()

    async def _unlink(self) -> None:
        link, partial = self._path, self._partial
        if link is not None and partial is not None:
            await run_blocking(self.lane, lambda: unlinked(link, partial))

    async def _stop(self, *, unseed: bool) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for written in self._written:
            if written.done() and not written.cancelled():
                written.exception()  # seen: the fetch had it, or nobody needs it now
        downloads, self._downloads = list(self._downloads.values()), {}
        for download in downloads:
            await download.aclose()
        if unseed:
            mine, self._mine = list(self._mine.values()), {}
            for torrent in mine:
                await self.swarm.remove(info_hash(torrent))
