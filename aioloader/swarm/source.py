"""A model's files read from the swarm, the origin behind it (``SwarmSource``).

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

Every byte is counted as from the origin or from the peers (``Reads``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from ..errors import LoaderError, ObjectChangedError
from ..reads.ranges import RangeSet
from ..redact import redacting_logger
from ..runtime.direct_io import fill
from ..runtime.threads import run_blocking
from ..sources.base import Blob, Current, ForwardingBlob, Landing, Source
from ..sources.digests import Digest
from .incoming import Follow, Incoming
from .manifest import FileOffer, file_name
from .session import Swarm

logger = redacting_logger(__name__)

__all__ = ["Follow", "Held", "Reads", "Route", "SwarmSource", "same_version"]


Held = Callable[[str, Current], Awaitable[Path | None]]
"""Where the cache holds the file at ``url`` at this version (and then offers it), or
None."""


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

    kind: Literal["origin", "held", "follow"]
    current: Current | None = None
    data: Path | None = None  # held: the cache entry's bytes
    follow: Follow | None = None
    offer: FileOffer | None = None


class Route(Protocol):
    """Whom a fetch follows for each file (coordinator.py's ``Plan``)."""

    def __call__(self, name: str) -> Follow | None:
        """The node followed for the file ``name``; None: read the origin."""

    def expect(self, names: list[str]) -> None:
        """The names of every file of the fetch."""


@dataclass
class Reads:
    """Bytes of one model read from the origin and from peers."""

    origin: int = 0
    peers: int = 0


class _OriginBlob(ForwardingBlob):
    """A file read from the origin by the node that leads: its bytes are counted, and
    its manifest entry shows them (``done``), so that followers see it move."""

    def __init__(
        self, inner: Blob, reads: Reads, offer: FileOffer, noted: Callable[[FileOffer], None]
    ) -> None:
        super().__init__(inner)
        self.reads = reads
        self.offer = offer
        self.noted = noted

    def _count(self, n: int) -> None:
        self.reads.origin += n
        self.offer = replace(self.offer, done=min(self.offer.size, self.offer.done + n))
        self.noted(self.offer)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        data = await self.inner.read_bytes(offset, length)
        self._count(len(data))
        return data

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self.inner.read_into(offset, buffers)
        self._count(sum(b.nbytes for b in buffers))


class _SwarmBlob(Blob):
    """One file of a followed node, read from the swarm as its pieces arrive
    (incoming.py); the read that completes the file answers for its digest."""

    def __init__(self, source: SwarmSource, incoming: Incoming, current: Current) -> None:
        self.source = source
        self.incoming = incoming
        self.url = incoming.url
        # The origin's version, never the peer's word: the cache records it.
        self.size, self.etag, self.last_modified = current
        self._read = RangeSet()

    def __repr__(self) -> str:
        return f"<SwarmBlob {self.incoming!r}>"

    async def ready(self, offset: int, length: int) -> None:
        with self.source.blaming(self.incoming.follow):
            await self.incoming.ready(offset, offset + length)

    @contextlib.asynccontextmanager
    async def landing(self, path: Path) -> AsyncIterator[Landing | None]:
        async with self.incoming.landing(path) as lands:
            yield self if lands else None

    async def arrived(self, start: int, end: int) -> None:
        """Landing: bytes ``[start, end)`` are in the cache's file, checked."""
        with self.source.blaming(self.incoming.follow):
            await self.incoming.ready(start, end)
        self.source.reads.peers += max(0, min(end, self.size) - start)

    async def verified(self) -> None:
        """Landing: the whole file matches the origin's digest."""
        with self.source.blaming(self.incoming.follow):
            await self.incoming.checked()

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        with self.source.blaming(self.incoming.follow):
            length = await self.incoming.read_into(offset, buffers)
            self.source.reads.peers += length
            self._read.add(offset, offset + length)
            if self._read.covers(0, self.size):
                await self.incoming.checked()

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def aclose(self) -> None:
        """Nothing of its own: the download is the fetch's (``SwarmSource.aclose``)."""


class _HeldBlob(Blob):
    """A file the cache holds at the origin's current version: the fetch reads nothing
    of it, and what else reads it (the index, for the layout) reads the cache entry.
    Should the entry go meanwhile, the origin is opened then, and must still be that
    version."""

    def __init__(
        self, origin: Source, url: str, current: Current, data: Path, lane: Executor
    ) -> None:
        self.origin, self.url, self.current = origin, url, current
        self.size, self.etag, self.last_modified = current
        self.data, self.lane = data, lane
        self._blob: Blob | None = None

    def __repr__(self) -> str:
        return f"<HeldBlob {self.url}>"

    async def _opened(self) -> Blob:
        if self._blob is None:
            blob = await self.origin.open(self.url)
            if Current(blob.size, blob.etag, blob.last_modified) != self.current:
                await blob.aclose()
                raise ObjectChangedError(
                    f"{self.url} changed at the origin while it was fetched; fetch it again"
                )
            self._blob = blob
        return self._blob

    def _read_held(self, offset: int, buffers: Sequence[memoryview]) -> bool:
        """Fill ``buffers`` from the cache entry (blocking); False if it is gone."""
        want = sum(b.nbytes for b in buffers)
        try:
            fd = os.open(self.data, os.O_RDONLY)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size != self.size:
                return False
            at = offset
            for buffer in buffers:
                at += fill(fd, buffer.cast("B"), at, buffer.nbytes)
            return at - offset == want
        except EOFError:
            return False
        finally:
            os.close(fd)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        if self._blob is None and await run_blocking(
            self.lane, lambda: self._read_held(offset, buffers)
        ):
            return
        await (await self._opened()).read_into(offset, buffers)

    async def aclose(self) -> None:
        if self._blob is not None:
            await self._blob.aclose()


class SwarmSource(Source):
    """The files of one model: from a followed node's torrents, or from the origin.

    Args:
        origin: the URL's store (the origin).
        lane: the fetch's cache lane (scratch reads).
        swarm: the daemon's session.
        scratch: where downloads land before the cache copies them.
        reads: where bytes are counted.
        route: the node followed for a file's name (None: read the origin); its
            ``expect(names)`` is told the names of every file of the fetch.
        noted: called with each file the origin opened (the leader's manifest).
        held: whether the cache holds a file at the origin's current version (and, if
            so, offers it to the peers at once).

    ``blamed``: the first followed node whose file failed (a stall, an error, a copy
    the cache refused), for the coordinator to drop.
    """

    def __init__(
        self,
        origin: Source,
        lane: Executor,
        swarm: Swarm,
        scratch: Path,
        reads: Reads,
        route: Route,
        noted: Callable[[FileOffer], None],
        held: Held,
    ) -> None:
        self.origin = origin
        self.lane = lane
        self.swarm = swarm
        self.scratch = scratch
        self.reads = reads
        self.route = route
        self.noted = noted
        self.held = held
        self.blamed: str | None = None
        self._ways: dict[str, asyncio.Future[_Way]] = {}
        self.etag_is_md5 = origin.etag_is_md5
        self._incoming: dict[str, Incoming] = {}  # name -> its download, for this fetch

    def __repr__(self) -> str:
        return f"<SwarmSource origin={self.origin!r}>"

    async def list_dir(self, url: str) -> list[str] | None:
        return await self.origin.list_dir(url)

    def expect(self, urls: list[str]) -> None:
        self.route.expect([file_name(u) for u in urls])

    async def _way(self, url: str) -> _Way:
        """Where the file ``url`` comes from, decided once a fetch (ready and open share
        it; a failed decision is asked again)."""
        name = file_name(url)
        found = self._ways.get(name)
        if found is None or (found.done() and (found.cancelled() or found.exception())):
            found = self._ways[name] = asyncio.ensure_future(self._decide(url, name))
        return await asyncio.shield(found)

    async def _decide(self, url: str, name: str) -> _Way:
        follow = self.route(name)
        if follow is None:
            return _Way("origin")
        current = await self.origin.current(url)  # the origin's failure, not the peer's
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

    async def ready(self, url: str) -> None:
        await self._way(url)

    async def open(self, url: str) -> Blob:
        name = file_name(url)
        way = await self._way(url)
        if way.kind == "held":
            assert way.current is not None and way.data is not None
            return _HeldBlob(self.origin, url, way.current, way.data, self.lane)
        if way.kind == "follow":
            assert way.follow is not None and way.current is not None
            follow, size = way.follow, way.current.size
            incoming = self._incoming.get(name)
            if incoming is None or incoming.size != size:
                digest = await self.origin.publisher_digest(url)
                incoming = self._incoming.get(name)  # another open started it meanwhile
                if incoming is None or incoming.size != size:
                    if incoming is not None:
                        await incoming.aclose()
                    incoming = self._incoming[name] = Incoming(
                        follow, self.swarm, self.scratch, self.lane, url, name, size, digest,
                    )  # fmt: skip
            return _SwarmBlob(self, incoming, way.current)
        blob = await self.origin.open(url)
        offer = FileOffer(name, url, blob.size, blob.etag, blob.last_modified)
        self.noted(offer)
        return _OriginBlob(blob, self.reads, offer, self.noted)

    async def object_checksums(self, url: str) -> dict[str, str]:
        return await self.origin.object_checksums(url)

    async def publisher_digest(self, url: str) -> Digest | None:
        return await self.origin.publisher_digest(url)

    def join(self, base: str, name: str) -> str:
        return self.origin.join(base, name)

    def parent(self, url: str) -> str:
        return self.origin.parent(url)

    @contextlib.contextmanager
    def blaming(self, follow: Follow) -> Iterator[None]:
        """Note ``follow``'s node as ``blamed`` when the block fails (first one only)."""
        try:
            yield
        except LoaderError:
            if self.blamed is None:
                self.blamed = follow.node
            raise

    async def release(self, name: str) -> None:
        """The file ``name`` is in the cache: its download and scratch copy go."""
        incoming = self._incoming.pop(name, None)
        if incoming is not None:
            await incoming.aclose()

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
