"""The write-after mode of a load through the cache: loads into host memory.

A read returns as soon as its bytes have arrived and their digest is taken; its
write waits until the blob is closed, when the load's reads are over, and runs in
writer threads while the entry's commit waits for it (commit.py). The load goes at
the remote's speed with no disk write in it (docs/benchmarks.md). A tensor changed
in place before its bytes were written costs the entry (the commit checks each
range against its digest, partial.py), never its correctness; the memory of the
tensors stays alive until written.

``LaterWrites`` is the queue those ranges wait in. Bytes that reached a load another
way (another rank of a ``group=`` load sent them) wait in it too, whatever the mode.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from typing import TYPE_CHECKING

from ..threads import CACHE_WRITES
from .partial import PartialFile, range_digest
from .ranges import RangeSet

if TYPE_CHECKING:
    from .filling_blob import FillingBlob

__all__ = ["LaterWrites", "WriteAfter"]


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


class WriteAfter:
    """Reads into host memory: take the digest on arrival, write after the load."""

    async def arrived(self, blob: FillingBlob, offset: int, views: list[memoryview]) -> None:
        """Queue bytes just read from the remote into the caller's ``views``."""
        if sum(v.nbytes for v in views):
            digest = await blob.run(lambda: range_digest(views))
            blob.later.add(offset, views, digest)
