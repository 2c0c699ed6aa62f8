"""A blob whose bytes also go into a cache as they arrive, so one read serves both.

``FillingBlob`` wraps the remote file's blob and feeds a ``Sink`` (base.py): ranges
the cache has already are read from it; a range read from the remote is written
through (``through``: a lane, for staged loads whose buffers are reused as soon as
the read returns: the read waits for its write, so memory stays bounded by the
staging ring with no queue between them) or kept to be written after the load
(``through=None``: host tensors, which stay as they are). When a write finds the
cache unable to take the bytes, the sink gives up and the blob reads on from the
remote alone. Closing the blob, once no write is running (a write still in its
thread must not meet a closed file), hands the file to the sink's ``commit``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from ..errors import DigestMismatchError
from ..runtime.threads import Lane, finish_before_cancel
from ..sources.base import Blob, CacheOutcome, ForwardingBlob, clip
from .base import Sink

__all__ = ["FillingBlob"]

T = TypeVar("T")


class FillingBlob(ForwardingBlob):
    """``inner``, its bytes also going into ``sink`` (see the module).

    Args:
        inner: the remote file's blob; closed with this one.
        sink: the file on its way into a cache.
        through: the lane that writes each range before its read returns; None: the
            sink keeps the caller's memory and writes it after the load.
    """

    def __init__(self, inner: Blob, sink: Sink, *, through: Lane | None) -> None:
        super().__init__(inner)
        self.sink = sink
        self._through = through
        self._writing: set[asyncio.Future[None]] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"<filling {self.sink!r} from {self.inner!r}>"

    @property
    def cache_outcome(self) -> CacheOutcome | None:
        return self.sink.outcome or self.inner.cache_outcome

    def received(self, offset: int, buffers: Sequence[memoryview]) -> None:
        if not self._closed:
            self.sink.received(offset, clip(buffers, self.size - offset))

    async def read_bytes(self, offset: int, length: int) -> bytes:
        sink = self.sink
        if sink.caching and sink.covers(offset, min(offset + length, self.size)):
            buffer = bytearray(max(0, min(length, self.size - offset)))
            await sink.read(offset, [memoryview(buffer)])
            return bytes(buffer)
        data = await self._fetch(self.inner.read_bytes(offset, length))
        await self._arrived(offset, clip([memoryview(data)], self.size - offset))
        return data

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        sink = self.sink
        if not sink.caching:
            await self.inner.read_into(offset, buffers)
            return
        views = clip(buffers, self.size - offset)
        if sink.covers(offset, offset + sum(v.nbytes for v in views)):
            await sink.read(offset, buffers)
            return
        await self._fetch(self.inner.read_into(offset, buffers))
        await self._arrived(offset, views)

    async def _fetch(self, read: Awaitable[T]) -> T:
        try:
            return await read
        except DigestMismatchError:
            self.sink.refused()  # closing drops what was cached
            raise

    async def _arrived(self, offset: int, views: list[memoryview]) -> None:
        """Hand bytes just read from the remote to the sink."""
        sink = self.sink
        if not sink.caching or self._closed:
            return
        sink.fetched(sum(v.nbytes for v in views))
        if self._through is None:
            await sink.keep(offset, views)
            return
        end = offset + sum(v.nbytes for v in views)
        future = asyncio.get_running_loop().run_in_executor(
            self._through, lambda: sink.write(offset, views)
        )
        self._writing.add(future)

        def done(f: asyncio.Future[None]) -> None:
            # On the loop, before any task awaiting ``f`` resumes: ``aclose`` sees it.
            self._writing.discard(f)
            if not f.cancelled() and f.exception() is None:
                sink.written.add(offset, end)

        future.add_done_callback(done)
        try:
            await finish_before_cancel(future)
        except OSError as exc:
            sink.failed(exc)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.inner.aclose()
        finally:
            try:
                if self._writing:
                    # Writes whose readers were cancelled: their threads still run.
                    both = asyncio.gather(*self._writing, return_exceptions=True)
                    await finish_before_cancel(both)
            finally:
                await self.sink.commit(self)
