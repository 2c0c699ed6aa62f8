"""A remote blob whose bytes also fill its cache entry, so one network read serves both.

Ranges already in the entry's partial file are read locally. What a read from the
remote does with its bytes is the blob's ``WriteMode``: write them before the read
returns (write_through.py) or once the load is over (write_after.py). Once every
byte is written or queued, closing the blob hands the entry to a commit thread,
which completes it after the load has returned (commit.py); a partial load leaves
it resumable. When the cache cannot take the bytes, the blob reads on from the
remote alone and closing it deletes the entry's partial files; so does a file its
source refuses (a digest that does not match, sources/verifying.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..errors import ClosedError, DigestMismatchError
from ..sources.base import Blob, CacheOutcome, ForwardingBlob, clip
from . import commit
from .claim import Claim
from .entry import cache_error, discard_quietly
from .partial import PartialFile, range_digest
from .write_after import LaterWrites

if TYPE_CHECKING:
    from .caching_source import CachingSource
    from .protocol import CacheProtocol

__all__ = ["FillingBlob", "WriteMode"]

T = TypeVar("T")


class WriteMode(Protocol):
    """When a load's bytes are written into the entry (write_through.py, write_after.py)."""

    async def arrived(self, blob: FillingBlob, offset: int, views: list[memoryview]) -> None:
        """Take bytes just read from the remote into the caller's ``views``."""


class FillingBlob(ForwardingBlob):
    """A remote blob whose bytes are also written into the entry's partial file.

    When a write finds the cache full, the blob stops caching (``partial`` is None)
    and reads on from the remote; ``aclose`` then deletes the partial files.
    """

    def __init__(
        self,
        source: CachingSource,
        remote: Blob,
        partial: PartialFile,
        lock: Claim,
        mode: WriteMode,
    ) -> None:
        super().__init__(remote)
        self.cache: CacheProtocol = source.cache
        self.partial: PartialFile | None = partial
        self.later = LaterWrites()
        self._source = source
        self._owned = partial
        self._lock = lock
        self._mode = mode
        self._closed = False
        source.track(self)

    def __repr__(self) -> str:
        have = self.partial.done.total if self.partial is not None else "uncached"
        return f"<caching {self.inner!r} have={have}/{self.size}>"

    @property
    def cache_outcome(self) -> CacheOutcome | None:
        return "miss"

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the source's threads (the blob must be open)."""
        if self._closed:
            raise ClosedError(f"{self.url} was already closed")
        return await self._source.run(fn)

    def give_up(self, exc: OSError) -> None:
        """The cache cannot take this file's bytes: read on uncached, say why (once)."""
        self.partial = None
        self.cache.warn_uncached(exc, self.url)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        partial = self.partial
        if partial is None:
            await self.inner.read_into(offset, buffers)
            return
        views = clip(buffers, self.size - offset)
        end = offset + sum(v.nbytes for v in views)
        if partial.covers(offset, end):
            try:
                await self.run(lambda: partial.read(offset, buffers))
            except OSError as exc:
                raise cache_error(exc, self.cache.root, f"reading the cache of {self.url}") from exc
            return
        try:
            await self.inner.read_into(offset, buffers)
        except DigestMismatchError:
            self.partial = None  # refused by its source: closing deletes what was cached
            raise
        self._lock.beat()
        self.cache.record_download(end - offset)
        await self._mode.arrived(self, offset, views)

    def received(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Bytes of this file that reached the caller another way (another rank of a
        ``group=`` load sent them): cached as if read here, so that the entry completes
        though this process read only its share. They are the caller's tensors, which
        stay alive until written, like ``write_after``'s. Blocking (takes their digest)
        and safe beside reads: called from the exchange's thread."""
        partial = self.partial
        if partial is None or self._closed:
            return
        views = clip(buffers, self.size - offset)
        end = offset + sum(v.nbytes for v in views)
        if end > offset and not partial.covers(offset, end):
            self.later.add(offset, views, range_digest(views))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._source.untrack(self)
        handed_off = False
        try:
            await self.inner.aclose()
            partial = self.partial
            if partial is not None:
                # The tensors are out: what is left (writing the queued ranges, then
                # completing the entry if every byte is there) need not hold the load
                # up, and runs after it (commit.py).
                finished = partial.covered_with(self.later.start(partial))
                if finished or self.later.started:
                    # From here the holder waits for nothing else: other loads may wait.
                    # Marked now, before the load returns, so that the next load waits;
                    # should another process be looking at the mark, the commit retries.
                    with contextlib.suppress(OSError):
                        self._lock.mark(partial.files)
                    cache, url, later, release = self.cache, self.url, self.later, self._release
                    lock = self._lock

                    def job() -> None:
                        with contextlib.suppress(OSError):
                            lock.mark(partial.files, patient=True)
                        commit.settle(cache, url, partial, later, finished, release)

                    commit.submit(cache.root, job)
                    handed_off = True
        finally:
            self._closed = True
            if not handed_off:
                try:
                    if self.partial is None:
                        # The cache gave up on this file: leave none of it behind.
                        await self._source.run(self._discard)
                finally:
                    self._release()

    def _discard(self) -> None:
        self._owned.close()
        discard_quietly(self._owned.files)

    def _release(self) -> None:
        self._owned.close()
        self._lock.release()
