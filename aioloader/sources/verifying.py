"""A blob whose bytes are checked against the digest its publisher gives (digests.py).

A file read whole is hashed as its bytes arrive, and its digest compared before
the reader is done with it: the read that completes the file raises
``DigestMismatchError`` when they differ, and so does ``check_unchanged``, which a
load and ``aioloader fetch`` call after a file's last read. Nothing of a corrupted
file is returned by a load or written by a fetch; a stream has handed out the
file's tensors by then, and fails at that point.

Ranges complete out of order, and a digest takes the bytes in order, so the hash
trails the arrivals over the prefix of the file that has arrived without a gap:

- a read that continues that prefix feeds its bytes (and those of later reads
  waiting for it) to the hash in a thread before it returns: the caller's buffer
  (a staging slot, soon reused) is read back while it still holds them;
- a read that lands past a gap waits for the gap to fill: as it is, in host
  memory that keeps its bytes until the load returns (kept.py), else copied (in
  a thread); once the copies of the whole process hold ``HOLD_LIMIT`` bytes, a
  range is only noted, and read again from the storage when the hash gets to it;
- a read the hash has passed already (a header read twice) changes nothing.

Only one thread hashes a file at a time, never the event loop. A file that is not
read whole (``tensors=``, ``rows=``, the share of one rank of a ``group=`` load)
cannot be checked, and is not: its copies are dropped when it closes.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from ..cache.ranges import RangeSet
from ..errors import DigestMismatchError
from ..kept import BUFFERS_KEPT
from ..redact import redacting_logger
from ..threads import run_blocking
from .base import Blob, clip
from .digests import Digest, Running
from .held_copies import HeldCopies

__all__ = ["HELD", "HOLD_LIMIT", "VerifyingBlob", "verifying"]

logger = redacting_logger(__name__)

#: Bytes of early arrivals the process keeps copies of, over every file it checks.
HOLD_LIMIT = 512 << 20
_REREAD = 16 << 20  # the largest read again at once

HELD = HeldCopies()


def verifying(blob: Blob, digest: Digest | None, lane: Executor) -> Blob:
    """``blob`` checked against ``digest``; ``blob`` itself when there is none, or none
    this process can compute."""
    running = digest.running() if digest is not None else None
    if digest is None or running is None:
        if digest is not None:
            logger.debug("%s: %s cannot be computed here; read unchecked", blob.url, digest.where)
        return blob
    return VerifyingBlob(blob, digest, running, lane)


@dataclass(order=True)
class _Waiting:
    """Bytes that arrived and are not hashed yet; ``copy``: the held buffer they are in."""

    offset: int
    order: int
    views: list[memoryview] = field(compare=False)
    copy: np.ndarray | None = field(default=None, compare=False)

    @property
    def end(self) -> int:
        return self.offset + sum(v.nbytes for v in self.views)


def _copy_into(buffer: np.ndarray, views: Sequence[memoryview]) -> memoryview:
    """The bytes of ``views`` back to back in ``buffer`` (numpy copies without the GIL)."""
    at = 0
    for view in views:
        buffer[at : at + view.nbytes] = np.frombuffer(view, dtype=np.uint8)
        at += view.nbytes
    return memoryview(buffer[:at]).cast("B")  # type: ignore[arg-type]


class VerifyingBlob(Blob):
    """``inner``, its bytes hashed in order as they arrive (see the module).

    Args:
        inner: the file's blob; closed with this one.
        digest: what the publisher gives for the whole file.
        running: ``digest``'s hash, fed here.
        lane: the threads that hash and copy.
    """

    def __init__(self, inner: Blob, digest: Digest, running: Running, lane: Executor) -> None:
        self.url = inner.url
        self.size = inner.size
        self.etag = getattr(inner, "etag", None)
        self.last_modified = getattr(inner, "last_modified", None)
        self.digest = digest
        self._inner = inner
        self._running = running
        self._lane = lane
        self._hashed = 0  # bytes [0, _hashed) are in the hash
        self._arrived = RangeSet()  # every byte read so far
        self._ready = RangeSet()  # hashed, waiting, or noted to be read again
        self._waiting: list[_Waiting] = []  # a heap, by offset
        self._order = 0
        self._reread = RangeSet()  # arrived but not kept: read again when hashed
        self._turn = asyncio.Lock()  # one hashing at a time
        self._broken = False  # some bytes may have changed before they were hashed
        self._actual: str | None = None  # the digest, once every byte is hashed
        self._open = True
        HELD.enter()

    def __repr__(self) -> str:
        return f"<verifying {self._inner!r} {self.digest.algorithm} hashed={self._hashed}>"

    async def read_bytes(self, offset: int, length: int) -> bytes:
        data = await self._inner.read_bytes(offset, length)
        await self._arrive(offset, [memoryview(data)], kept=True)
        return data

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self._inner.read_into(offset, buffers)
        kept = BUFFERS_KEPT.get()  # tensor memory, unseen until the load returns
        await self._arrive(offset, clip(buffers, self.size - offset), kept=kept)

    async def check_unchanged(self) -> None:
        await self._inner.check_unchanged()
        await self.verify()

    async def verify(self) -> bool:
        """Hash what is left of a file read whole and compare; False when it was not
        read whole (nothing to compare).

        Raises:
            DigestMismatchError: the bytes are not the ones the publisher hashed.
        """
        if self._broken or not self._arrived.covers(0, self.size):
            return False
        await self._drive()
        self._raise()
        return True

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._drop()
            HELD.leave()
        await self._inner.aclose()

    # -- arrivals ----------------------------------------------------------------------

    async def _arrive(self, offset: int, views: list[memoryview], *, kept: bool) -> None:
        """Take bytes just read into ``views`` (``kept``: they never change)."""
        nbytes = sum(v.nbytes for v in views)
        end = offset + nbytes
        if end <= self._hashed or self._broken:
            return
        self._arrived.add(offset, end)
        if kept or self._ready.covers(self._hashed, offset):
            self._push(offset, views)
            if not self._ready.covers(self._hashed, offset):
                return  # bytes that never change wait as they are
            try:
                await self._drive()
            except BaseException:
                if self._hashed < end and not kept:
                    # Not hashed (cancelled, a failed read again): the buffer may be reused.
                    self._broken = True
                    self._drop()
                raise
        else:
            await self._hold(offset, views, nbytes)
            if not self._ready.covers(self._hashed, offset):
                return
            await self._drive()  # the gap filled while this was copied: hash on
        self._raise()

    async def _hold(self, offset: int, views: list[memoryview], nbytes: int) -> None:
        """Keep a copy of bytes that landed past a gap, or note them to read again."""
        buffer = HELD.take(nbytes, HOLD_LIMIT)
        if buffer is None:
            self._reread.add(offset, offset + nbytes)
            self._ready.add(offset, offset + nbytes)
            return
        try:
            copy = await run_blocking(self._lane, lambda: _copy_into(buffer, views))
        except BaseException:
            HELD.give(buffer, nbytes)
            raise
        self._push(offset, [copy], buffer)

    def _push(self, offset: int, views: list[memoryview], copy: np.ndarray | None = None) -> None:
        self._order += 1
        waiting = _Waiting(offset, self._order, views, copy)
        heapq.heappush(self._waiting, waiting)
        self._ready.add(offset, waiting.end)

    # -- hashing -----------------------------------------------------------------------

    async def _drive(self) -> None:
        """Hash every byte that continues the hashed prefix, reading noted ranges again."""
        async with self._turn:
            while not self._broken:
                taken = self._take()
                if taken:
                    await self._hash(taken)
                    continue
                gap = self._reread_at(self._hashed)
                if not gap:
                    break
                buffer = memoryview(bytearray(gap))
                await self._inner.read_into(self._hashed, [buffer])
                await self._hash([_Waiting(self._hashed, 0, [buffer])])
            if self._hashed >= self.size and self._actual is None and not self._broken:
                self._actual = self._running.result()
                if self._actual == self.digest.value:
                    logger.debug("%s: matches %s", self.url, self.digest.where)

    def _take(self) -> list[_Waiting]:
        """The waiting bytes that continue the hashed prefix, in order."""
        taken: list[_Waiting] = []
        at = self._hashed
        while self._waiting and self._waiting[0].offset <= at:
            waiting = heapq.heappop(self._waiting)
            taken.append(waiting)
            at = max(at, waiting.end)
        return taken

    def _reread_at(self, position: int) -> int:
        """Bytes to read again from ``position`` (0: it is not a noted range)."""
        for start, end in self._reread:
            if start <= position < end:
                return min(end - position, _REREAD)
        return 0

    async def _hash(self, taken: list[_Waiting]) -> None:
        """Feed ``taken`` (in order, from at most ``_hashed``) to the hash in a thread."""
        views: list[memoryview] = []
        at = self._hashed
        for waiting in taken:
            skip = at - waiting.offset
            for view in waiting.views:
                if skip < view.nbytes:
                    views.append(view[max(skip, 0) :])
                    at += view.nbytes - max(skip, 0)
                skip -= view.nbytes
        running = self._running

        def update() -> None:
            for view in views:
                running.update(view)

        try:
            await run_blocking(self._lane, update)
        except asyncio.CancelledError:
            self._hashed = at  # run_blocking waited for the thread: the bytes are in
            raise
        except BaseException:
            self._broken = True
            raise
        finally:
            _give_back(taken)
        self._hashed = at

    def _drop(self) -> None:
        """Forget the waiting bytes (their copies go back)."""
        waiting, self._waiting = self._waiting, []
        _give_back(waiting)

    def _raise(self) -> None:
        actual = self._actual
        if actual is None or actual == self.digest.value:
            return
        digest = self.digest
        raise DigestMismatchError(
            f"{self.url}: the {self.size} bytes read do not match the {digest.algorithm} "
            f"{digest.where}: expected {digest.value}, got {actual}. They were corrupted "
            "between the storage and this process and are refused: nothing of them is "
            "returned or written (a stream has handed out this file's tensors already: "
            "drop them). Load or fetch it again; if it fails the same way, the stored "
            "copy is damaged: tell whoever publishes it",
            url=self.url,
            algorithm=digest.algorithm,
            expected=digest.value,
            actual=actual,
        )


def _give_back(waiting: list[_Waiting]) -> None:
    for entry in waiting:
        if entry.copy is not None:
            HELD.give(entry.copy, entry.end - entry.offset)
            entry.copy = None
