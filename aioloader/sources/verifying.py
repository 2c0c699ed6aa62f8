"""A blob whose bytes are checked against the digest its publisher gives (digests.py).

A file read whole is hashed as its bytes arrive, and its digest compared before
the reader is done with it: the read that completes the file waits for the hash
and raises ``DigestMismatchError`` when they differ, and so does
``check_unchanged``, which a load and ``aioloader fetch`` call after a file's last
read. Nothing of a corrupted file is returned by a load or written by a fetch; a
stream has handed out the file's tensors by then, and fails at that point.

Ranges complete out of order, and a digest takes the bytes in order, so the hash
trails the arrivals over the prefix of the file that has arrived without a gap, in
one task per file that hashes in a thread (never on the event loop) while the
reads go on. What waits for the hash waits in one of three ways:

- in host memory that keeps its bytes until the load returns (kept.py), as it is;
- a read the hash is waiting for, when no hashing is running, is hashed before
  it returns (its buffer, a staging slot say, is reused once it has);
- anything else is copied (in a thread), as long as the copies of the whole
  process hold less than ``HOLD_LIMIT`` bytes; past that, a range is only noted,
  and read again from the storage when the hash gets to it.

A read the hash has passed already (a header read twice) changes nothing. A file
that is not read whole (``tensors=``, ``rows=``, the share of one rank of a
``group=`` load) cannot be checked, and is not: what waits is dropped when it closes.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from ..errors import DigestMismatchError
from ..reads.kept import BUFFERS_KEPT
from ..reads.ranges import RangeSet
from ..redact import redacting_logger
from ..runtime.threads import run_blocking
from .base import Blob, ForwardingBlob, clip
from .digests import Digest, Running
from .held_copies import HeldCopies

__all__ = ["HELD", "HOLD_LIMIT", "VerifyingBlob", "verifying"]

logger = redacting_logger(__name__)

#: Bytes of early arrivals the process keeps copies of, over every file it checks.
HOLD_LIMIT = 512 << 20
_REREAD = 16 << 20  # the largest read again at once

HELD = HeldCopies()


T = TypeVar("T")


async def open_beside(opening: Awaitable[Blob], asking: Awaitable[T]) -> tuple[Blob, T]:
    """``opening``'s blob and ``asking``'s answer (a HEAD for the object's digest), the
    two in flight at once. The open's failure is the one told (the question is
    cancelled); the question's failure closes the blob."""
    question = asyncio.ensure_future(asking)
    try:
        blob = await opening
    except BaseException:
        question.cancel()
        await asyncio.wait([question])
        if not question.cancelled():
            question.exception()  # the open's error is the one to tell
        raise
    try:
        return blob, await question
    except BaseException:
        await blob.aclose()
        raise


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


class VerifyingBlob(ForwardingBlob):
    """``inner``, its bytes hashed in order as they arrive (see the module).

    Args:
        inner: the file's blob; closed with this one.
        digest: what the publisher gives for the whole file.
        running: ``digest``'s hash, fed here.
        lane: the threads that hash and copy.
    """

    def __init__(self, inner: Blob, digest: Digest, running: Running, lane: Executor) -> None:
        super().__init__(inner)
        self.digest = digest
        self._running = running
        self._lane = lane
        self._hashed = 0  # bytes [0, _hashed) are in the hash
        self._arrived = RangeSet()  # read and taken in: hashed, waiting or noted
        self._waiting: list[_Waiting] = []  # a heap, by offset
        self._order = 0
        self._reread = RangeSet()  # arrived but not kept: read again when hashed
        self._turn = asyncio.Lock()  # one hashing at a time
        self._driver: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None  # what stopped the hash
        self._actual: str | None = None  # the digest, once every byte is hashed
        self._open = True
        HELD.enter()

    def __repr__(self) -> str:
        return f"<verifying {self.inner!r} {self.digest.algorithm} hashed={self._hashed}>"

    @property
    def checked(self) -> str | None:
        actual = self._actual
        return actual if actual is not None and actual == self.digest.value else None

    async def read_bytes(self, offset: int, length: int) -> bytes:
        data = await self.inner.read_bytes(offset, length)
        await self._arrive(offset, [memoryview(data)], kept=True)
        return data

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self.inner.read_into(offset, buffers)
        kept = BUFFERS_KEPT.get()  # tensor memory, unseen until the load returns
        await self._arrive(offset, clip(buffers, self.size - offset), kept=kept)

    async def check_unchanged(self) -> None:
        await self.inner.check_unchanged()
        await self.verify()

    async def verify(self) -> bool:
        """Hash what is left of a file read whole and compare; False when it was not
        read whole (nothing to compare).

        Raises:
            DigestMismatchError: the bytes are not the ones the publisher hashed.
            ReadError: a range to read again could not be read.
        """
        if not self._arrived.covers(0, self.size):
            return False
        while self._driver is not None:
            await asyncio.shield(self._driver)  # a cancelled caller leaves it to aclose
        if self._failure is None:
            await self._drive()  # hashes what is left, or keeps why it cannot
        if self._failure is not None:
            raise self._failure
        if self._actual is not None and self._actual != self.digest.value:
            confirm = self.digest.confirm
            if confirm is not None and not await confirm():
                self._actual = None  # its parts were guessed wrong: read unchecked
                return False
            self._raise()
        return self._actual is not None

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            driver = self._driver
            if driver is not None:
                driver.cancel()
                await asyncio.wait([driver])  # its thread's hash finishes first
            self._drop()
            HELD.leave()
        await self.inner.aclose()

    # -- arrivals ----------------------------------------------------------------------

    async def _arrive(self, offset: int, views: list[memoryview], *, kept: bool) -> None:
        """Take bytes just read into ``views`` (``kept``: they stay as they are until the
        hash gets to them), then start the hash on, or finish it if the file is whole."""
        nbytes = sum(v.nbytes for v in views)
        end = offset + nbytes
        if end <= self._hashed or self._failure is not None:
            return
        if kept:
            self._push(offset, views)
        elif offset <= self._hashed and not self._turn.locked():
            async with self._turn:  # free: taken at once, nothing else hashes meanwhile
                await self._hash([_Waiting(offset, 0, views)])
        else:
            await self._hold(offset, views, nbytes)
        self._arrived.add(offset, end)
        if self._arrived.covers(0, self.size):
            await self.verify()  # the read that completes the file answers for it
        else:
            self._start()

    async def _hold(self, offset: int, views: list[memoryview], nbytes: int) -> None:
        """Keep a copy of bytes that cannot wait as they are, or note them to read again."""
        buffer = HELD.take(nbytes, HOLD_LIMIT)
        if buffer is None:
            self._reread.add(offset, offset + nbytes)
            return
        try:
            copy = await run_blocking(self._lane, lambda: _copy_into(buffer, views))
        except BaseException:
            HELD.give(buffer, nbytes)
            raise
        self._push(offset, [copy], buffer)

    def _push(self, offset: int, views: list[memoryview], copy: np.ndarray | None = None) -> None:
        self._order += 1
        heapq.heappush(self._waiting, _Waiting(offset, self._order, views, copy))

    # -- hashing -----------------------------------------------------------------------

    def _start(self) -> None:
        """Start the task that hashes on, when there is something to hash and none runs."""
        if self._driver is not None or self._failure is not None or not self._open:
            return
        next_ready = (self._waiting and self._waiting[0].offset <= self._hashed) or (
            self._reread_at(self._hashed) > 0
        )
        if next_ready:
            self._driver = asyncio.get_running_loop().create_task(
                self._drive_then_forget(), name=f"aioloader digest {self.url}"
            )

    async def _drive_then_forget(self) -> None:
        try:
            await self._drive()
        finally:
            self._driver = None

    async def _drive(self) -> None:
        """Hash every byte that continues the hashed prefix, reading noted ranges again;
        a failure stops the hash for good and is kept for ``verify``."""
        try:
            async with self._turn:
                while True:
                    taken = self._take()
                    if taken:
                        await self._hash(taken)
                        continue
                    gap = self._reread_at(self._hashed)
                    if not gap:
                        break
                    buffer = memoryview(bytearray(gap))
                    await self.inner.read_into(self._hashed, [buffer])
                    await self._hash([_Waiting(self._hashed, 0, [buffer])])
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._failure = exc
            self._drop()
            return
        if self._hashed >= self.size and self._actual is None:  # the last bytes, here or
            self._actual = self._running.result()  # hashed by the read that brought them
            if self._actual == self.digest.value:
                logger.debug(
                    "%s: matches the %s %s", self.url, self.digest.algorithm, self.digest.where
                )

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
        finally:
            _give_back(taken)
        self._hashed = at

    def _drop(self) -> None:
        """Forget the waiting bytes (their copies go back)."""
        waiting, self._waiting = self._waiting, []
        _give_back(waiting)

    def _raise(self) -> None:
        actual = self._actual
        assert actual is not None
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
