"""The blobs a swarm fetch reads (supply.py): a file from the origin, counted and shown
to the peers (``OriginBlob``); a followed node's file read from its scratch copy as its
pieces arrive (``SwarmBlob``); a file the cache holds at the origin's version
(``HeldBlob``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path

from ..errors import ObjectChangedError
from ..reads.ranges import RangeSet
from ..runtime.direct_io import fill
from ..runtime.threads import run_blocking
from ..sources.base import Blob, Current, ForwardingBlob, Source
from .counts import Reads
from .incoming import Follow, Incoming
from .manifest import FileOffer

__all__ = ["Blame", "HeldBlob", "OriginBlob", "Reads", "SwarmBlob"]

Blame = Callable[[Follow], contextlib.AbstractContextManager[None]]
"""Notes the followed node as to blame when the block fails (``SwarmSupply.blaming``)."""


class OriginBlob(ForwardingBlob):
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
        self.reads.from_origin(self.offer.name, n)
        self.offer = replace(self.offer, done=min(self.offer.size, self.offer.done + n))
        self.noted(self.offer)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        data = await self.inner.read_bytes(offset, length)
        self._count(len(data))
        return data

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self.inner.read_into(offset, buffers)
        self._count(sum(b.nbytes for b in buffers))


class SwarmBlob(Blob):
    """One file of a followed node, read from the swarm as its pieces arrive
    (incoming.py); the read that completes the file answers for its digest."""

    def __init__(self, blame: Blame, reads: Reads, incoming: Incoming, current: Current) -> None:
        self.blame, self.reads = blame, reads
        self.incoming = incoming
        self.url = incoming.url
        # The origin's version, never the peer's word: the cache records it.
        self.size, self.etag, self.last_modified = current
        self._read = RangeSet()

    def __repr__(self) -> str:
        return f"<SwarmBlob {self.incoming!r}>"

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        with self.blame(self.incoming.follow):
            length = await self.incoming.read_into(offset, buffers)
            self.reads.from_peers(self.incoming.name, length)
            self._read.add(offset, offset + length)
            if self._read.covers(0, self.size):
                await self.incoming.checked()

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def aclose(self) -> None:
        """Nothing of its own: the download is the fetch's (``SwarmSupply.aclose``)."""


class HeldBlob(Blob):
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
