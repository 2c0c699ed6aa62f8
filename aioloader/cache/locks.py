"""``flock`` on an entry's lock files, awaited without blocking the event loop.

A blocking ``flock`` in a thread cannot be cancelled: a cancelled load would
leave the thread waiting and then holding the lock. Instead the lock is tried
with ``LOCK_NB`` (a syscall that never blocks) and retried after a growing
pause, so waiting is an ordinary cancellable ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

from .._threads import run_blocking

__all__ = ["FileLock", "acquire", "try_acquire"]

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
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _try(fd: int, exclusive: bool) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def try_acquire(path: Path, *, exclusive: bool) -> FileLock | None:
    """Take the lock now or return None (sync: never blocks on the lock)."""
    fd = _open(path)
    if _try(fd, exclusive):
        return FileLock(path, fd)
    os.close(fd)
    return None


async def acquire(path: Path, *, exclusive: bool) -> FileLock:
    """Wait for the lock on ``path`` (created if missing), polling without blocking the loop.

    Raises:
        OSError: the lock file cannot be created.
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
