"""Where a swarm fetch's files come from (``SwarmSupply``: the cache's ``Supply``).

A node that leads (``follow`` is None) reads the origin, and notes each file it opens
in its own manifest, with the bytes it has read of it (``done``), so that its
followers see the files' sizes and versions at once, and see it move. A node that
follows another first asks the origin for the file's current size and validators
(``Source.current``: a HEAD where the store answers one, no body): a file the cache
holds at that version is published at once and read from nowhere (a warm node never
waits for another to list what it holds); a followed node's copy of another version
(superseded, or not yet the new one) is never taken, the file comes from the origin.
Otherwise the file is read from the swarm (incoming.py): its download starts as
soon as the followed node publishes the file's torrent, and byte ranges are handed
out as their pieces arrive, checked by libtorrent; where the origin publishes a
digest of the file, the read that completes the file waits for the whole copy's
hash and fails on a mismatch (``DigestMismatchError``): the cache discards what it
wrote, and the coordinator turns to another node or to the origin. The cache checks
the bytes as for any download too (its checksum, the ETag or checksum
``object_checksums`` of the origin gives). The scratch copies go when the fetch ends.

In a cold split, a file of 64 MiB or more comes in byte ranges (ranged.py): this
node's ranges read from the origin, the others' downloaded from their pullers, all
straight into the cache entry's partial file.

Every byte is counted as from the origin or from the peers (``Reads``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from ..cache.entry import Version
from ..cache.supply import Arrival, Delivery, Supply
from ..errors import LoaderError
from ..redact import redacting_logger
from ..sources.base import Blob, Current, Source
from .blobs import HeldBlob, OriginBlob, Reads, SwarmBlob
from .download import SwarmError
from .incoming import Follow, Incoming
from .manifest import FileOffer, file_name
from .ranged import Ranged
from .ranges import RANGED_FROM
from .session import Swarm
from .splits import Split
from .view import RangeView

logger = redacting_logger(__name__)

__all__ = [
    "FileWay", "Follow", "Held", "Publish", "Reads", "Route", "SwarmSupply", "same_version",
]  # fmt: skip


Held = Callable[[str, Current], Awaitable[Path | None]]
"""Where the cache holds the file at ``url`` at this version (and then offers it), or
None."""

Publish = Callable[[str, Path, Version], Awaitable[None]]
"""Offer a file this fetch committed: its URL, its data, its version."""


def same_version(offer: FileOffer, current: Current) -> bool:
    """Whether a peer's ``offer`` is the origin's ``current`` version: the same size and
    strong ETag, or, where the origin gives no ETag, the same Last-Modified. Without
    either, nothing tells: no."""
    if offer.size != current.size:
        return False
    if current.etag is not None:
        return offer.etag == current.etag
    return current.last_modified is not None and offer.last_modified == current.last_modified


@dataclass(frozen=True)
class _Way:
    """Where one file of a fetch comes from: the origin, the cache (held), or a node."""

    kind: Literal["origin", "held", "follow", "ranged"]
    current: Current | None = None
    data: Path | None = None  # held: the cache entry's bytes
    follow: Follow | None = None
    offer: FileOffer | None = None


@dataclass(frozen=True)
class FileWay:
    """How a file of a running fetch comes, as the cluster's view shows it (view.py):
    ``origin``, ``held`` (the cache has it), ``follow`` (from ``node``, whose API is
    ``api``) or ``deciding`` (asking the origin, waiting for the followed node to list
    it); ``size``, the origin's (where it was asked); ``info_hash``, its download's
    once started; ``ranges``, how each range of a file dealt in ranges comes."""

    kind: Literal["origin", "held", "follow", "deciding"]
    size: int | None = None
    node: str | None = None
    api: str | None = None
    info_hash: str | None = None
    ranges: tuple[RangeView, ...] = ()


class Route(Protocol):
    """Whom a fetch follows for each file (coordinator.py's ``Plan``)."""

    def __call__(self, name: str) -> Follow | None:
        """The node followed for the file ``name``; None: read the origin."""

    def expect(self, names: list[str]) -> None:
        """The names of every file of the fetch."""

    def ranged(self) -> Split | None:
        """The pullers a large file is dealt among in ranges (None: no split)."""


class _Following(Delivery):
    """A followed node's file: read from its scratch copy (``SwarmBlob``), or landed
    straight into the cache's partial file (``Incoming.landing``)."""

    def __init__(self, supply: SwarmSupply, incoming: Incoming, blob: SwarmBlob) -> None:
        super().__init__(blob)
        self.supply, self.incoming = supply, incoming

    async def ready(self, start: int, end: int) -> None:
        with self.supply.blaming(self.incoming.follow):
            await self.incoming.ready(start, end)

    @contextlib.asynccontextmanager
    async def landing(self, path: Path) -> AsyncIterator[Arrival | None]:
        # A whole file lands in its scratch copy, as it always did in a daemon: the
        # fetch never took a landing until an empty RangeSet was false (reads/ranges.py),
        # and the fleet's tests count on the scratch copy. Landing it in the partial
        # file (Incoming.landing, tested in test_swarm_session.py) is a step of its own.
        yield None

    async def arrived(self, start: int, end: int) -> None:
        """Arrival: bytes ``[start, end)`` are in the cache's file, checked."""
        with self.supply.blaming(self.incoming.follow):
            await self.incoming.ready(start, end)
        arrived = max(0, min(end, self.incoming.size) - start)
        self.supply.reads.from_peers(self.incoming.name, arrived)

    async def verified(self) -> None:
        """Arrival: the whole file matches the origin's digest."""
        with self.supply.blaming(self.incoming.follow):
            await self.incoming.checked()


class SwarmSupply(Supply):
    """The files of one try of a model's fetch: from a followed node's torrents, held
    by the cache already, or read from the origin (and shown to the peers).

    Args:
        swarm: the daemon's session.
        scratch: where downloads land before the cache copies them.
        reads: where bytes are counted.
        route: the node followed for a file's name (None: read the origin); its
            ``expect(names)`` is told the names of every file of the fetch.
        noted: called with each file the origin opened (the leader's manifest).
        held: whether the cache holds a file at the origin's current version (and, if
            so, offers it to the peers at once).
        publish: offers each file the fetch committed.

    ``blamed``: the first followed node whose file failed (a stall, an error, a copy
    the cache refused), for the coordinator to drop; a failure elsewhere (the origin,
    this node's own disk) blames nobody.
    """

    def __init__(
        self,
        swarm: Swarm,
        scratch: Path,
        reads: Reads,
        route: Route,
        noted: Callable[[FileOffer], None],
        held: Held,
        publish: Publish,
    ) -> None:
        self.swarm = swarm
        self.scratch = scratch
        self.reads = reads
        self.route = route
        self.noted = noted
        self.held = held
        self.publish = publish
        self.blamed: str | None = None
        self._ways: dict[str, asyncio.Future[_Way]] = {}
        self._incoming: dict[str, Incoming] = {}  # name -> its download, for this fetch
        self._ranged: dict[str, Ranged] = {}  # name -> its ranges, for this fetch

    def __repr__(self) -> str:
        return f"<SwarmSupply {self.route!r}>"

    def expect(self, urls: list[str]) -> None:
        self.route.expect([file_name(u) for u in urls])

    async def _way(self, url: str, origin: Source) -> _Way:
        """Where the file ``url`` comes from, decided once a fetch (its opens share it;
        a failed decision is asked again)."""
        name = file_name(url)
        found = self._ways.get(name)
        if found is None or (found.done() and (found.cancelled() or found.exception())):
            found = self._ways[name] = asyncio.ensure_future(self._decide(url, name, origin))
        return await asyncio.shield(found)

    async def _decide(self, url: str, name: str, origin: Source) -> _Way:
        follow = self.route(name)
        split = self.route.ranged()
        if follow is None and split is None:
            return _Way("origin")
        current = await origin.current(url)  # the origin's failure, not the peer's
        if split is not None and current.size >= RANGED_FROM:
            data = await self.held(url, current)
            return _Way("held", current, data=data) if data else _Way("ranged", current)
        if follow is None:
            return _Way("origin")
        data = await self.held(url, current)
        if data is not None:
            return _Way("held", current, data=data)
        with self.blaming(follow):
            offer = await follow.offer(name)
        if not same_version(offer, current):
            logger.warning(
                "%s: %r offers another version (%d bytes, ETag %s) than the origin serves "
                "(%d bytes, ETag %s); read from the origin",
                url, follow, offer.size, offer.etag, current.size, current.etag,
            )  # fmt: skip
            return _Way("origin")
        return _Way("follow", current, follow=follow, offer=offer)

    async def delivery(self, url: str, origin: Source, lane: Executor) -> Delivery | None:
        name = file_name(url)
        way = await self._way(url, origin)
        if way.kind == "held":
            assert way.current is not None and way.data is not None
            return Delivery(HeldBlob(origin, url, way.current, way.data, lane))
        if way.kind == "origin":
            return None
        if way.kind == "ranged":
            return await self._range(url, name, origin, lane, way)
        assert way.follow is not None and way.current is not None
        follow, size = way.follow, way.current.size
        incoming = self._incoming.get(name)
        if incoming is None or incoming.size != size:
            digest = await origin.publisher_digest(url)
            incoming = self._incoming.get(name)  # another open started it meanwhile
            if incoming is None or incoming.size != size:
                if incoming is not None:
                    await incoming.aclose()
                incoming = self._incoming[name] = Incoming(
                    follow, self.swarm, self.scratch, lane, url, name, size, digest,
                )  # fmt: skip
        blob = SwarmBlob(self.blaming, self.reads, incoming, way.current)
        return _Following(self, incoming, blob)

    async def _range(
        self, url: str, name: str, origin: Source, lane: Executor, way: _Way
    ) -> Ranged:
        split, current = self.route.ranged(), way.current
        assert split is not None and current is not None
        ranged = self._ranged.get(name)
        if ranged is None or ranged.size != current.size:
            digest = await origin.publisher_digest(url)
            ranged = self._ranged.get(name)  # another open made it meanwhile
            if ranged is None or ranged.size != current.size:
                if ranged is not None:
                    await ranged.aclose()
                ranged = self._ranged[name] = Ranged(
                    split, self.swarm, lane, origin, url, name, current, self.reads,
                    self.noted, digest, self.scratch,
                )  # fmt: skip
        return ranged

    def ways(self) -> dict[str, FileWay]:
        """How each file this try opened comes."""
        found = {}
        for name, decided in self._ways.items():
            if not decided.done() or decided.cancelled() or decided.exception() is not None:
                found[name] = FileWay("deciding")
                continue
            way = decided.result()
            follow, incoming = way.follow, self._incoming.get(name)
            digest = incoming.info_hash if incoming is not None else None
            size = way.current.size if way.current is not None else None
            if way.kind == "ranged":
                ranged = self._ranged.get(name)  # its own ranges, and the others'
                found[name] = FileWay("origin", size, ranges=ranged.roles() if ranged else ())
            elif follow is None:
                found[name] = FileWay(way.kind, size)
            else:
                found[name] = FileWay(way.kind, size, follow.node, follow.api, digest)
        return found

    def from_origin(self, blob: Blob) -> Blob:
        offer = FileOffer(file_name(blob.url), blob.url, blob.size, blob.etag, blob.last_modified)
        self.noted(offer)
        return OriginBlob(blob, self.reads, offer, self.noted)

    async def committed(self, url: str, data: Path, version: Version) -> None:
        name = file_name(url)
        ranged = self._ranged.pop(name, None)
        if ranged is not None:  # its ranges seeded from the entry before anything else
            await ranged.committed(data)
        try:
            await self.publish(url, data, version)
        finally:
            # Seeded from the cache entry now: its download goes (and a scratch copy at
            # once, most of it before the kernel writes it back to disk).
            incoming = self._incoming.pop(name, None)
            if incoming is not None:
                await incoming.aclose()

    def detour(self, error: BaseException) -> bool:
        """A file whose followed node failed (``SwarmError``: stalled, gone, a torrent
        error) lets the others finish; the file comes another way next try."""
        return isinstance(error, SwarmError)

    @contextlib.contextmanager
    def blaming(self, follow: Follow) -> Iterator[None]:
        """Note ``follow``'s node as ``blamed`` when the block fails (first one only)."""
        try:
            yield
        except LoaderError:
            if self.blamed is None:
                self.blamed = follow.node
            raise

    async def aclose(self) -> None:
        """Stop and remove this fetch's downloads (the origin is its owner's to close)."""
        for way in self._ways.values():
            way.cancel()
        if self._ways:
            await asyncio.wait(list(self._ways.values()))
        self._ways = {}
        incoming, self._incoming = list(self._incoming.values()), {}
        for one in incoming:
            await one.aclose()
        ranged, self._ranged = list(self._ranged.values()), {}
        for each in ranged:
            await each.aclose()
