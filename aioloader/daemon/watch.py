"""The daemon's view of the cache, kept in memory so that probes never touch the disk.

``/ready`` and ``/v1/models`` answer from the registry alone. What can make a
ready model stale is its files leaving the cache: evicted by the cache's size
limit after another fetch, removed by ``DELETE``, or deleted by another process
on the node (a pod's own load evicting, an operator's ``aioloader cache``). So
the registry is checked against the disk:

- right after the daemon itself changed the cache (a download ended, a model was
  deleted): ``refresh()``, awaited by that download or request;
- and every ``interval`` seconds otherwise, for the changes of other processes.

A check looks at the files of the ready models only (one ``stat`` each, in a
worker thread), never at every entry of the cache: its cost follows the models
the daemon holds, not the size of the cache. Each model found evicted is handed
to ``on_evicted`` (the downloads fetch a preload again).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..redact import redacting_logger
from ..runtime.resource import AsyncResource
from ..runtime.threads import Lane, run_blocking
from .metrics import Metrics
from .state import ModelRecord, Registry, display_url

if TYPE_CHECKING:
    from ..cache import ModelCache

__all__ = ["REFRESH_INTERVAL", "CacheWatch"]

logger = redacting_logger(__name__)

REFRESH_INTERVAL = 5.0
"""Seconds between checks for files that other processes removed from the cache."""


class CacheWatch(AsyncResource):
    """Marks ready models whose files left the cache as ``evicted``.

    Use as ``async with CacheWatch(cache, registry, metrics) as watch:``; the
    periodic check runs until the block exits. Its checks read the cache folder in
    its own ``watch`` lane (threads.py), closed with it.
    """

    def __init__(
        self,
        cache: ModelCache,
        registry: Registry,
        metrics: Metrics,
        *,
        interval: float = REFRESH_INTERVAL,
    ) -> None:
        self._cache = cache
        self._registry = registry
        self._metrics = metrics
        self._interval = interval
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._lane = Lane("watch", 1)
        self.checks = 0
        self.on_evicted: Callable[[ModelRecord], None] | None = None

    def __repr__(self) -> str:
        return f"<CacheWatch interval={self._interval} checks={self.checks}>"

    async def __aenter__(self) -> CacheWatch:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="aioloader cache watch"
        )
        return self

    async def aclose(self) -> None:
        """Stop the periodic check; idempotent."""
        task, self._task = self._task, None
        try:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            self._lane.shutdown(wait=True)

    async def refresh(self) -> None:
        """Check the ready models' files now; one check runs at a time."""
        async with self._lock:
            ready = [(r, r.finished) for r in self._registry.all() if r.status == "ready"]
            urls = sorted({url for record, _ in ready for url in record.files})
            if not urls:
                return
            missing = await run_blocking(self._lane, lambda: self._missing(urls))
            self.checks += 1
            for record, finished in ready:
                # Skip a record that was downloaded again while the thread looked.
                if record.status == "ready" and record.finished == finished:
                    self._check(record, missing)

    def _check(self, record: ModelRecord, missing: set[str]) -> None:
        if any(url in missing for url in record.files):
            record.status = "evicted"
            self._metrics.evicted()
            logger.info("%s (%s) was evicted from the cache", display_url(record.url), record.id)
            if self.on_evicted is not None:
                self.on_evicted(record)

    def _missing(self, urls: list[str]) -> set[str]:
        """The files whose data is no longer in the cache (blocking: runs in a thread)."""
        return {url for url in urls if not self._cache.entry_files(url).data.is_file()}

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception as exc:  # the disk misbehaves: say so, keep serving
                logger.warning("checking the cache for evicted models failed: %s", exc)
