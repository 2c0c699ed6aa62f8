"""Removing entries on request: ``ModelCache.remove``, and a corrupt entry that
``ModelCache.verify`` found (verify.py).

Each waits for a download of the entry to end (its ``lock``), and each takes the
entry's links under ``<root>/models/`` with it (links.py). Eviction, which skips
entries in use instead of waiting, is eviction.py. Their blocking calls run in
``lane``, the caller's (threads.py).
"""

from __future__ import annotations

from concurrent.futures import Executor

from ..errors import CacheError
from ..runtime.threads import run_blocking
from .entry import EntryFiles, cache_error, read_meta
from .links import prune_models
from .locks import acquire, try_acquire_async

__all__ = ["remove_corrupt", "remove_entry"]


async def remove_entry(files: EntryFiles, url: str, stall: float, lane: Executor) -> bool:
    """Delete the entry of ``url``; see ``ModelCache.remove``.

    Raises:
        CacheError: a load is reading the entry right now, or the disk refused.
    """
    if not await run_blocking(lane, files.exists):
        return False
    lock = await acquire(files.lock, exclusive=True, executor=lane, stall=stall, what=url)
    try:
        use = await try_acquire_async(files.use, exclusive=True, executor=lane)
        if use is None:
            raise CacheError(
                f"model cache {files.root}: {url} is being read by a load; remove it "
                "once the load has finished"
            )
        try:
            existed = await run_blocking(lane, files.meta.exists)
            await run_blocking(lane, files.discard)
        finally:
            use.release()
        if existed:
            await run_blocking(lane, lambda: prune_models(files.root))
    except OSError as exc:
        raise cache_error(exc, files.root, f"removing {url}") from exc
    finally:
        lock.release()
    return existed


async def remove_corrupt(files: EntryFiles, url: str, stall: float, lane: Executor) -> bool:
    """Delete the entry of ``url`` if it is still the one found corrupt; returns whether.

    Readers that hold its file open keep reading their copy; no new load gets it.

    Raises:
        OSError: as the file system reports.
    """
    lock = await acquire(files.lock, exclusive=True, executor=lane, stall=stall, what=url)
    try:

        def discard() -> bool:
            meta = read_meta(files)
            if meta is None or not meta.belongs_to(url):
                return False
            files.discard()
            prune_models(files.root)
            return True

        return await run_blocking(lane, discard)
    finally:
        lock.release()
