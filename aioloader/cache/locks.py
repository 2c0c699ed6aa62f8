"""``flock`` on an entry's lock files, awaited without blocking the event loop.

A blocking ``flock`` in a thread cannot be cancelled: a cancelled load would
leave the thread waiting and then holding the lock. Instead the lock is tried
with ``LOCK_NB`` (a syscall that never blocks) and retried after a growing
pause, so waiting is an ordinary cancellable ``asyncio.sleep``.

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
from concurrent.futures import Executor
from pathlib import Path

from .._threads import run_blocking
from .paths import open_file

__all__ = ["FileLock", "acquire", "try_acquire", "try_acquire_async"]

_FIRST_PAUSE = 0.005
_LONGEST_PAUSE = 0.2


class FileLock:
    """A held ``flock``; ``release()`` is idempotent."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def __repr__(self) -> str:
        return f"<FileLock {self.path} held={self._fd is not None}>"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the lock


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


def _release(lock: FileLock | None) -> None:
    if lock is not None:
        lock.release()


async def try_acquire_async(
    path: Path, *, exclusive: bool, executor: Executor | None = None
) -> FileLock | None:
    """``try_acquire`` in a thread of ``executor``.

    A lock the thread took after the caller was cancelled is released, not leaked
    (a leaked lock would make every later load of the entry wait forever).
    """
    return await run_blocking(
        executor, lambda: try_acquire(path, exclusive=exclusive), on_abandon=_release
    )


async def acquire(path: Path, *, exclusive: bool) -> FileLock:
    """Wait for the lock on ``path`` (created if missing), polling without blocking the loop.

    Raises:
        OSError: the lock file cannot be created.
        CacheError: it is a symbolic link.
    """
    fd = await run_blocking(None, lambda: _open(path), os.close)
    try:
        pause = _FIRST_PAUSE
        while not _try(fd, exclusive):
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return FileLock(path, fd)
