"""Claiming an entry for download: the one way loads and fetches take its lock."""

from __future__ import annotations

from concurrent.futures import Executor

from .._threads import run_blocking
from .entry import EntryFiles, Version
from .locks import FileLock, acquire, try_acquire_async

__all__ = ["claim"]


async def claim(files: EntryFiles, version: Version, executor: Executor) -> FileLock | None:
    """The entry's download lock, held; ``None`` when the entry is complete for ``version``
    by the time the lock is free (another process downloaded it meanwhile: read its copy).

    The lock is tried first without waiting; if another process holds it, this waits
    for that download to end rather than download the same bytes twice.

    Raises:
        OSError: the entry cannot be created or locked (the caller says which cache).
        CacheError: a symbolic link was planted where the lock file goes.
    """
    await run_blocking(executor, files.make)
    lock = await try_acquire_async(files.lock, exclusive=True, executor=executor)
    if lock is None:
        lock = await acquire(files.lock, exclusive=True)
    try:
        done = await run_blocking(executor, lambda: files.complete_for(version))
    except BaseException:
        lock.release()
        raise
    if done is not None:
        lock.release()
        return None
    return lock
