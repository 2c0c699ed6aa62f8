"""Claiming an entry for download: the one way loads and fetches take its lock.

Waiting for an entry that another process is downloading saves downloading its
bytes twice, but a wait inside a load can close a cycle: two loads of ``[f1, f2]``
and ``[f2, f1]`` each hold one entry for their whole load; the ranks of one
``group=`` wait for each other in a collective while one waits for the other's
entry; ``load_model([u, u])`` waits for itself. So:

* a holder that waits for nothing else while it holds the entry marks it with
  its ``writer`` lock: a fetch (``ModelCache.fetch``, the daemon), which holds
  each entry only while it downloads that one file, and a load's commit after
  the load has returned (caching_source.py, ``Claim.mark``);
* a load waits only for a marked entry. An entry another load holds (it may be
  waiting itself), or a writer that stalled, is read from the remote without
  caching (``BUSY``): never a deadlock, at worst the same bytes downloaded twice;
* every wait is bounded by the holder's progress (locks.py).

A holder lets go of its lock before its mark, so a load that finds the lock held and
no mark knows the holder is no marked one still letting go: it tries the lock once
more (the holder may have let go of both since its first try) and only then streams
uncached. So a load right after another, whose writes and commit still hold the
entry, waits for them and reads the entry, never the remote, whenever it looks.
Taking the mark can fail while another process looks at it (``held_by_other`` holds it
for an instant): ``mark`` retries for up to ``_MARK_PATIENCE`` seconds where it may
block.
"""

from __future__ import annotations

import enum
import time
from concurrent.futures import Executor

from ..redact import redacting_logger
from ..runtime.threads import run_blocking
from .entry import EntryFiles, Version
from .locks import (
    STALL_SECONDS,
    FileLock,
    LockStalled,
    acquire,
    held_by_other,
    try_acquire,
    try_acquire_async,
)

logger = redacting_logger(__name__)

__all__ = ["BUSY", "Claim", "claim"]

_MARK_PATIENCE = 1.0  # seconds ``mark(patient=True)`` tries for
_MARK_PAUSE = 0.001


class _Busy(enum.Enum):
    BUSY = "busy"


BUSY = _Busy.BUSY
"""``claim(..., by="load")``: another load holds the entry; read the remote uncached."""


class Claim:
    """An entry held for download: its ``lock``, and once it waits for nothing else,
    its ``writer`` mark."""

    def __init__(self, lock: FileLock, mark: FileLock | None = None) -> None:
        self.lock = lock
        self._mark = mark

    def __repr__(self) -> str:
        return f"<Claim {self.lock.path.parent} fetch={self._mark is not None}>"

    def mark(self, files: EntryFiles, *, patient: bool = False) -> None:
        """Say that from now on this holder waits for nothing else (sync: two syscalls
        a try; idempotent).

        Args:
            patient: where blocking is allowed (a thread): try again for up to
                ``_MARK_PATIENCE`` seconds while another process looks at the mark, or
                the previous holder is letting go of it (see the module docstring).

        Raises:
            OSError: the mark's file cannot be opened.
        """
        deadline = time.monotonic() + _MARK_PATIENCE
        while self._mark is None:
            self._mark = try_acquire(files.writer, exclusive=True)
            if self._mark is not None or not patient or time.monotonic() > deadline:
                return
            time.sleep(_MARK_PAUSE)

    def beat(self) -> None:
        """Tell waiters the download makes progress (see ``FileLock.beat``)."""
        self.lock.beat()

    def release(self) -> None:
        """Idempotent; the lock goes first, so a held entry without a mark is never a
        marked holder letting go (see the module docstring)."""
        self.lock.release()
        if self._mark is not None:
            self._mark.release()


async def claim(
    files: EntryFiles,
    version: Version,
    executor: Executor,
    *,
    by: str,
    stall: float = STALL_SECONDS,
    url: str = "",
) -> Claim | _Busy | None:
    """Hold the entry for download.

    Args:
        by: ``"fetch"`` or ``"load"`` (see the module docstring).
        stall: the bound on a wait for a holder that shows no progress.

    Returns:
        The Claim; ``None`` when the entry is complete for ``version`` by the time the
        lock is free (another process downloaded it: read its copy); ``BUSY`` for a
        load when another load holds it.

    Raises:
        OSError: the entry cannot be created or locked (the caller says which cache).
        CacheError: a symbolic link was planted where a lock file goes; or the holder
            stalled.
    """
    await run_blocking(executor, files.make)
    lock = await try_acquire_async(files.lock, exclusive=True, executor=executor)
    if (
        lock is None
        and by == "load"
        and not await run_blocking(executor, lambda: held_by_other(files.writer))
    ):
        # No mark: a load holds it, or a marked holder let go of both meanwhile.
        lock = await try_acquire_async(files.lock, exclusive=True, executor=executor)
        if lock is None:
            return BUSY
    if lock is None:
        try:
            lock = await acquire(
                files.lock, exclusive=True, executor=executor, stall=stall, what=url
            )
        except LockStalled as exc:
            if by != "load":
                raise
            logger.warning("%s; loading %s without the cache", exc, url)
            return BUSY
    held = Claim(lock)
    try:
        done = await run_blocking(executor, lambda: files.complete_for(version))
        if done is not None:
            held.release()
            return None
        if by == "fetch":
            await run_blocking(executor, lambda: held.mark(files, patient=True))
    except BaseException:
        held.release()
        raise
    return held
