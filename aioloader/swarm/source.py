"""A model's files read from the swarm, the origin behind it (``SwarmSource``).

A node that leads (``follow`` is None) reads the origin, and notes each file it opens
in its own manifest, with the bytes it has read of it (``done``), so that its
followers see the files' sizes and versions at once, and see it move. A node that
follows another reads each file from the swarm (incoming.py): its download starts as
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

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from ..errors import LoaderError
from ..ranges import RangeSet
from ..sources.base import Blob, ForwardingBlob, Landing, Source
from ..sources.digests import Digest
from .incoming import Follow, Incoming
from .manifest import FileOffer, file_name
from .session import Swarm

__all__ = ["Follow", "Reads", "Route", "SwarmSource"]


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

    def __init__(self, source: SwarmSource, incoming: Incoming, offer: FileOffer) -> None:
        self.source = source
        self.incoming = incoming
        self.url = incoming.url
        self.size = offer.size
        self.etag = offer.etag
        self.last_modified = offer.last_modified
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
    ) -> None:
        self.origin = origin
        self.lane = lane
        self.swarm = swarm
        self.scratch = scratch
        self.reads = reads
        self.route = route
        self.noted = noted
        self.blamed: str | None = None
        self.etag_is_md5 = origin.etag_is_md5
        self._incoming: dict[str, Incoming] = {}  # name -> its download, for this fetch

    def __repr__(self) -> str:
        return f"<SwarmSource origin={self.origin!r}>"

    async def list_dir(self, url: str) -> list[str] | None:
        return await self.origin.list_dir(url)

    def expect(self, urls: list[str]) -> None:
        self.route.expect([file_name(u) for u in urls])

    async def ready(self, url: str) -> None:
        name = file_name(url)
        follow = self.route(name)
        if follow is not None:
            with self.blaming(follow):
                await follow.offer(name)

    async def open(self, url: str) -> Blob:
        name = file_name(url)
        follow = self.route(name)
        if follow is not None:
            with self.blaming(follow):
                offer = await follow.offer(name)
            incoming = self._incoming.get(name)
            if incoming is None or incoming.size != offer.size:
                digest = await self.origin.publisher_digest(url)
                incoming = self._incoming.get(name)  # another open started it meanwhile
                if incoming is None or incoming.size != offer.size:
                    if incoming is not None:
                        await incoming.aclose()
                    incoming = self._incoming[name] = Incoming(
                        follow, self.swarm, self.scratch, self.lane,
                        url, name, offer.size, digest,
                    )  # fmt: skip
            return _SwarmBlob(self, incoming, offer)
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
        incoming, self._incoming = list(self._incoming.values()), {}
        for one in incoming:
            await one.aclose()
