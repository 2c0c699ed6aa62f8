"""The interface of a cache that loads fill: ``Sink``, one file on its way into a cache.

A ``FillingBlob`` (filling_blob.py) calls its sink as the load reads the file:
``covers`` and ``read`` for bytes the cache has already, ``fetched`` for bytes that
came from the remote, then ``write`` (write through: before the read returns, in a
thread) or ``keep`` (write after: the caller's memory, written once the load is
over), ``received`` for bytes another rank sent, and ``commit`` once, when the blob
is closed and no write runs any more. The node cache (cache/sink.py) and the hub
cache (hf/sink.py) implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..reads.ranges import RangeSet
from ..sources.base import Blob, CacheOutcome

__all__ = ["Sink"]


class Sink(ABC):
    """One file of a load on its way into a cache (see the module).

    Attributes:
        outcome: what the cache does for the load's report (report.py); None when
            the cache is not one a load reports on.
        caching: False once the cache gave up on the file (it cannot take the
            bytes) or its source refused it: the blob reads on from the remote
            alone and ``commit`` drops what was written.
        written: the ranges written through (each added once its write returned).
    """

    outcome: CacheOutcome | None = None

    def __init__(self) -> None:
        self.caching = True
        self.written = RangeSet()

    def covers(self, offset: int, end: int) -> bool:
        """Whether bytes ``[offset, end)`` are in the cache already, to be read from it."""
        return False

    async def read(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` from the cache's copy (only for ranges it ``covers``)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no bytes to read")

    def fetched(self, nbytes: int) -> None:  # noqa: B027 - optional hook
        """``nbytes`` just came from the remote, before they are written or kept."""

    @abstractmethod
    def write(self, offset: int, views: list[memoryview]) -> None:
        """Write through: put bytes just read into the cache before their read returns.

        Blocking: run in a thread, several at once. Raises OSError (see ``failed``).
        """

    @abstractmethod
    async def keep(self, offset: int, views: list[memoryview]) -> None:
        """Write after: take bytes just read into the caller's memory, which stays as
        it is until the load returns, to be written once the file is done with."""

    def received(self, offset: int, views: list[memoryview]) -> None:  # noqa: B027
        """Bytes of the file that reached the caller another way (another rank of a
        ``group=`` load sent them), theirs to keep like ``keep``'s; here: ignored.
        Blocking, called from the exchange's thread."""

    @abstractmethod
    def failed(self, exc: OSError) -> None:
        """A ``write`` failed: raise (the load fails), or give up caching the file
        (``caching = False``) and say why: the bytes are in the caller's buffers."""

    def refused(self) -> None:
        """The file's source refused its bytes (a digest that does not match): cache
        none of it."""
        self.caching = False

    @abstractmethod
    async def commit(self, blob: Blob) -> None:
        """``blob`` is closed and no write runs: commit the file (in the commit
        threads, commits.py) or drop it; release what the file held. Called once."""
