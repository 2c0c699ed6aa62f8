"""The node cache as a load's sink: a remote file's bytes also fill its cache entry.

``EntrySink`` is the node cache's ``Sink`` (sinks/base.py), fed by the
``FillingBlob`` a load through the cache reads (caching_source.py). Ranges already
in the entry's partial file are read from it. A range read from the remote is
written into the partial file before its read returns (write through: staged
loads), or its digest is taken on arrival and its write waits until the blob is
closed, when the load's reads are over (write after: host loads; the writes run in
writer threads while the entry's commit waits for them, write_after.py). The load
goes at the remote's speed with no disk write in it (docs/benchmarks.md). A tensor
changed in place before its bytes were written costs the entry (the commit checks
each range against its digest, partial.py), never its correctness; the memory of
the tensors stays alive until written.

Once every byte is written or queued, the blob's close hands the entry to a commit
thread, which completes it after the load has returned (commit.py); a partial load
leaves it resumable. When the cache cannot take the bytes (see ``entry.no_room``),
the load reads on from the remote alone and the close deletes the entry's partial
files; so does a file its source refuses (a digest that does not match,
sources/verifying.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from ..sinks import commits
from ..sinks.base import Sink
from ..sources.base import Blob, CacheOutcome
from .claim import Claim
from .commit import settle
from .entry import cache_error, discard_quietly, no_room
from .partial import PartialFile, range_digest
from .protocol import CacheProtocol
from .write_after import LaterWrites

__all__ = ["EntrySink"]

T = TypeVar("T")


class Run(Protocol):
    """Runs blocking file work in the cache's lane (``CachingSource.run``)."""

    def __call__(self, fn: Callable[[], T]) -> Awaitable[T]: ...


class EntrySink(Sink):
    """A remote file's bytes on their way into its entry's partial file, under its lock.

    When a write finds the cache full, the sink gives up (``caching`` is False) and
    the load reads on from the remote; ``commit`` then deletes the partial files.

    Args:
        cache: the cache the entry is in.
        url: the remote file.
        partial: the entry's partial file, open.
        lock: the entry's claim; released once the entry is committed or dropped.
        run: runs its file work (reads, digests, deleting) in the cache's lane.
        untrack: told when the blob is closed (caching_source.py keeps the blobs it
            handed out, to close them with itself).
    """

    outcome: CacheOutcome | None = "miss"  # for the load's report (report.py)

    def __init__(
        self,
        cache: CacheProtocol,
        url: str,
        partial: PartialFile,
        lock: Claim,
        *,
        run: Run,
        untrack: Callable[[Blob], None],
    ) -> None:
        super().__init__()
        self.url = url
        self.cache = cache
        self.partial = partial
        self.later = LaterWrites()
        self._run = run
        self._untrack = untrack
        self._lock = lock
        self._closed = False

    def __repr__(self) -> str:
        have = self.partial.done.total if self.caching else "uncached"
        return f"<entry of {self.url!r} have={have}/{self.partial.size}>"

    def covers(self, offset: int, end: int) -> bool:
        return self.partial.covers(offset, end)

    async def read(self, offset: int, buffers: Sequence[memoryview]) -> None:
        partial = self.partial
        try:
            await self._run(lambda: partial.read(offset, buffers))
        except OSError as exc:
            raise cache_error(exc, self.cache.root, f"reading the cache of {self.url}") from exc

    def fetched(self, nbytes: int) -> None:
        self._lock.beat()
        self.cache.record_download(nbytes)

    def write(self, offset: int, views: list[memoryview]) -> None:
        self.partial.write(offset, views)

    async def keep(self, offset: int, views: list[memoryview]) -> None:
        if sum(v.nbytes for v in views):
            digest = await self._run(lambda: range_digest(views))
            self.later.add(offset, views, digest)

    def received(self, offset: int, views: list[memoryview]) -> None:
        """Cached as if read here, so that the entry completes though this process read
        only its share. They are the caller's tensors, which stay alive until written,
        like ``keep``'s. Blocking (takes their digest) and safe beside reads."""
        partial = self.partial
        if not self.caching or self._closed:
            return
        end = offset + sum(v.nbytes for v in views)
        if end > offset and not partial.covers(offset, end):
            self.later.add(offset, views, range_digest(views))

    def failed(self, exc: OSError) -> None:
        """Give up on a cache without room (said once); raise ``CacheError`` otherwise."""
        if not no_room(exc):
            raise cache_error(exc, self.cache.root, f"writing {self.url}") from exc
        self.caching = False
        self.cache.warn_uncached(exc, self.url)

    async def commit(self, blob: Blob) -> None:
        self._untrack(blob)
        handed_off = False
        try:
            partial = self.partial
            if self.caching:
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
                        settle(cache, url, partial, later, finished, release)

                    commits.submit(cache.root, job)
                    handed_off = True
        finally:
            self._closed = True
            if not handed_off:
                try:
                    if not self.caching:
                        # The cache gave up on this file: leave none of it behind.
                        await self._run(self._discard)
                finally:
                    self._release()

    def _discard(self) -> None:
        self.partial.close()
        discard_quietly(self.partial.files)

    def _release(self) -> None:
        self.partial.close()
        self._lock.release()
