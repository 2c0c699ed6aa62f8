"""The queue of a node cache entry's writes after the load: ``LaterWrites``.

A load into host memory writes its bytes into the cache after its reads are over
(sink.py): each range waits here, the caller's memory with its digest taken on
arrival, until the blob is closed; then writer threads write them while the entry's
commit waits for them (commit.py). Bytes that reached a load another way (another
rank of a ``group=`` load sent them) wait here too, however the load writes.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import wait as wait_all

from ..reads.ranges import RangeSet
from ..runtime.threads import CACHE_WRITES
from .partial import PartialFile

__all__ = ["LaterWrites"]


Queued = tuple[int, list[memoryview], str]  # offset, the caller's bytes, their digest on arrival


class LaterWrites:
    """Ranges received and not written yet, with their digests on arrival.

    ``add`` is safe from any thread; ``start`` (once the blob is closed) hands them to
    writer threads, and ``finish`` waits for those writes (in the commit thread).
    """

    def __init__(self) -> None:
        self._queued: list[Queued] = []
        self._writes: list[Future[None]] = []
        self._error: OSError | None = None  # the first a writer thread met

    def add(self, offset: int, views: list[memoryview], digest: str) -> None:
        self._queued.append((offset, views, digest))

    @property
    def started(self) -> bool:
        """Whether ``start`` handed writes to the writer threads."""
        return bool(self._writes)

    def start(self, partial: PartialFile) -> RangeSet:
        """Write the queued ranges into ``partial`` in writer threads; returns those ranges."""
        queued, self._queued = self._queued, []
        pool = CACHE_WRITES.get()
        self._writes += [pool.submit(self._write, partial, *job) for job in queued]
        return RangeSet(
            (offset, offset + sum(v.nbytes for v in views)) for offset, views, _ in queued
        )

    def finish(self) -> None:
        """Wait for the writes (blocking).

        Raises:
            OSError: the first error a write met.
        """
        wait_all(self._writes)
        if self._error is not None:
            raise self._error

    def _write(
        self, partial: PartialFile, offset: int, views: list[memoryview], digest: str
    ) -> None:
        """One read's bytes into the partial file (in a writer thread)."""
        if self._error is not None:
            return  # the cache has given up on this file
        try:
            partial.write(offset, views, digest)
        except OSError as exc:
            if self._error is None:
                self._error = exc
