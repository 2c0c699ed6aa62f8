"""``flock`` on an entry's lock files, awaited without blocking the event loop.

A blocking ``flock`` in a thread cannot be cancelled: a cancelled load would
leave the thread waiting and then holding the lock. Instead the lock is tried
with ``LOCK_NB`` (a syscall that never blocks) and retried after a growing
pause, so waiting is an ordinary cancellable ``asyncio.sleep``.

No wait is without a bound. A holder that makes progress says so by touching
its lock file (``FileLock.beat``: at most once a second, as bytes arrive, are
written or hashed); a waiter gives up with a ``CacheError`` once the lock file
has not been touched for ``stall`` seconds (a hung download, a stream its caller
left open), naming the entry and what to do.

A lock taken here is never inherited: its descriptor is opened ``O_CLOEXEC``, and
a child made by ``fork`` (a ``multiprocessing`` pool started during a load) closes
its copies at once, so the lock is dropped when its holder releases it, not when
the last child exits.

A lock file is never followed when it is a symbolic link, and on a read-only
cache an existing one is opened read-only (``flock`` needs no write access), so
a read-only cache still serves what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import threading
import time
import weakref
from concurrent.futures import Executor
from pathlib import Path

from ..errors import CacheError
from ..runtime.threads import run_blocking
from .paths import open_file

__all__ = [
    "STALL_SECONDS",
    "FileLock",
    "LockStalled",
    "acquire",
    "held_by_other",
    "try_acquire",
    "try_acquire_async",
]

STALL_SECONDS = 120.0
"""How long a waiter waits for a lock whose holder shows no progress (see the docstring)."""

_FIRST_PAUSE = 0.005
_LONGEST_PAUSE = 0.2
_BEAT_EVERY = 1.0  # seconds between two touches of a lock file by its holder


class LockStalled(CacheError):
    """The holder of a lock that ``acquire`` waited for showed no progress for too long."""


# Every lock held by this process, so that a forked child can let go of its copies.
_held: weakref.WeakSet[FileLock] = weakref.WeakSet()
_held_guard = threading.Lock()


class FileLock:
    """A held ``flock``; ``release()`` is idempotent."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._beaten = 0.0
        with _held_guard:
            _held.add(self)

    def __repr__(self) -> str:
        return f"<FileLock {self.path} held={self._fd is not None}>"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def beat(self) -> None:
        """Tell waiters this holder is making progress (cheap: at most one syscall a second).

        Safe from any thread; a lock file the process cannot write (a read-only cache)
        is simply not touched.
        """
        now = time.monotonic()
        fd = self._fd
        if fd is None or now - self._beaten < _BEAT_EVERY:
            return
        self._beaten = now
        with contextlib.suppress(OSError):
            os.utime(fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with _held_guard:
                _held.discard(self)
            os.close(fd)  # closing the last descriptor drops the lock

    def _drop_in_child(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # the parent's descriptor keeps its lock


def _after_fork_in_child() -> None:
    global _held_guard
    _held_guard = threading.Lock()  # another thread may have held it at the fork
    for lock in list(_held):
        lock._drop_in_child()
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _open(path: Path) -> int:
    try:
        return open_file(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES):
            raise
        try:
            return open_file(path, os.O_RDONLY)
        except FileNotFoundError:
            raise exc from None


def _try(fd: int, exclusive: bool) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def try_acquire(path: Path, *, exclusive: bool) -> FileLock | None:
    """Take the lock now or return None (sync: never blocks on the lock).

    Raises:
        OSError: the lock file cannot be opened.
        CacheError: it is a symbolic link.
    """
    fd = _open(path)
    if _try(fd, exclusive):
        return FileLock(path, fd)
    os.close(fd)
    return None


def held_by_other(path: Path) -> bool:
    """Whether another holder has ``path`` locked, shared or exclusive (sync, never blocks).

    Raises:
        OSError: the lock file cannot be opened.
    """
    fd = _open(path)
    try:
        if not _try(fd, exclusive=True):
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _release(lock: FileLock | None) -> None:
    if lock is not None:
        lock.release()


async def try_acquire_async(path: Path, *, exclusive: bool, executor: Executor) -> FileLock | None:
    """``try_acquire`` in a thread of ``executor``.

    A lock the thread took after the caller was cancelled is released, not leaked
    (a leaked lock would make every later load of the entry wait forever).
    """
    return await run_blocking(
        executor, lambda: try_acquire(path, exclusive=exclusive), on_abandon=_release
    )


def _touched(fd: int) -> int:
    return os.fstat(fd).st_mtime_ns


async def acquire(
    path: Path,
    *,
    exclusive: bool,
    executor: Executor,
    stall: float = STALL_SECONDS,
    what: str = "",
) -> FileLock:
    """Wait for the lock on ``path`` (created if missing), polling without blocking the loop.

    Args:
        executor: the lane (threads.py) that opens the lock file.
        stall: give up once the holder has shown no progress (``FileLock.beat``) for
            this many seconds.
        what: what the lock guards, for the error (a URL).

    Raises:
        OSError: the lock file cannot be created.
        CacheError: it is a symbolic link; or its holder stalled (see ``stall``).
    """
    fd = await run_blocking(executor, lambda: _open(path), os.close)
    try:
        pause = _FIRST_PAUSE
        seen = _touched(fd)
        since = time.monotonic()
        while not _try(fd, exclusive):
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE)
            touched = _touched(fd)
            if touched != seen:
                seen, since = touched, time.monotonic()
            elif time.monotonic() - since > stall:
                raise LockStalled(
                    f"model cache {path.parent}: {what or 'the entry'} is held by another load "
                    f"or fetch that has made no progress for {stall:g} s (a download that "
                    "hangs, or a stream its caller left open); try again once it has ended, "
                    "or stop it"
                )
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return FileLock(path, fd)
