"""Checking an entry's bytes against the checksum recorded when they were written.

``check_entry`` is the sync core (it reads the whole file: run it in a thread);
``verify_entry`` drives it under the entry's ``use`` lock and removes what is corrupt
(removal.py), for ``ModelCache.verify``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from typing import TypeVar

from ..redact import redacting_logger
from ..runtime.threads import finish_before_cancel, run_blocking
from .checksum import hash_file
from .entry import EntryFiles, cache_error, read_meta, regular_size
from .locks import acquire
from .records import VerifyResult
from .removal import remove_corrupt

__all__ = ["check_entry", "run_stoppable", "verify_entry"]

logger = redacting_logger(__name__)

T = TypeVar("T")


def check_entry(files: EntryFiles, url: str, stop: threading.Event | None = None) -> VerifyResult:
    """Hash the entry's data again and compare (sync; reads the whole file).

    Raises:
        Stopped: ``stop`` was set.
    """
    meta = read_meta(files)
    if meta is None or not meta.belongs_to(url):
        return VerifyResult(url, "missing", f"{url} is not in the cache")
    if not meta.complete:
        return VerifyResult(url, "partial", f"{url}: a partial download, nothing to check yet")
    if meta.checksum is None:
        return VerifyResult(
            url, "unchecked",
            f"{url}: no checksum was recorded when it was written (by an older aioloader); "
            "remove it and fetch it again to have one",
        )  # fmt: skip
    size = regular_size(files.data)
    if size != meta.size:
        found = "missing" if size is None else f"{size} bytes"
        return VerifyResult(
            url, "corrupt", f"{url}: {files.data} is {found}, not the {meta.size} bytes written"
        )
    actual = hash_file(files.data, stop)
    if actual != meta.checksum:
        return VerifyResult(
            url, "corrupt",
            f"{url}: {files.data} hashes to {actual}, not {meta.checksum} as when it was "
            "written: its bytes changed on disk (check the disk)",
        )  # fmt: skip
    return VerifyResult(url, "ok", f"{url}: {meta.size} bytes match {meta.checksum}")


async def run_stoppable(lane: Executor, fn: Callable[[threading.Event], T]) -> T:
    """Run ``fn(stop)`` in ``lane``; when cancelled, set ``stop`` and wait for it to end.

    For long reads (hashing a file): the thread notices ``stop`` between blocks, so
    a cancelled caller neither waits for the whole file nor leaves a thread reading.
    """
    stop = threading.Event()
    future = asyncio.get_running_loop().run_in_executor(lane, fn, stop)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        stop.set()
        # Stopped, most likely: the caller's cancellation is what counts.
        with contextlib.suppress(Exception):
            await finish_before_cancel(future)
        raise


async def verify_entry(files: EntryFiles, url: str, stall: float, lane: Executor) -> VerifyResult:
    """Check one entry and remove it when corrupt; ``url`` is shown in the result: redacted.
    Its blocking calls (hashing too) run in ``lane``.

    Raises:
        CacheError: the entry cannot be read.
    """
    if not await run_blocking(lane, files.exists):
        return VerifyResult(url, "missing", f"{url} is not in the cache")
    try:
        # Held while hashing, so that eviction leaves the file alone meanwhile.
        use = await acquire(files.use, exclusive=False, executor=lane, stall=stall, what=url)
        try:
            result = await run_stoppable(lane, lambda stop: check_entry(files, url, stop))
        finally:
            use.release()
    except OSError as exc:
        raise cache_error(exc, files.root, f"verifying {url}") from exc
    if result.status != "corrupt":
        return result
    logger.warning("model cache %s: %s; removing it", files.root, result.detail)
    try:
        removed = await remove_corrupt(files, url, stall, lane)
    except OSError as exc:
        error = cache_error(exc, files.root, f"removing the corrupt {url}")
        return replace(result, detail=f"{result.detail}; {error}")
    return replace(result, removed=removed)
