"""The daemon's downloads: one task per model, all owned by one TaskGroup.

Each task records its own outcome on its model (ready, or failed with the
error), so a failure is never lost and never takes the group, or the daemon,
down with it. Closing the supervisor cancels what still runs and waits for it:
the cache keeps a cancelled download's bytes under a temporary name, to be
resumed by the next fetch of the same URL.

A failed model, a preload (``--model``) or one added through the API, is tried
again after the delays of a ``Backoff`` (retry.py), until it succeeds, the model
is deleted (which cancels its task, waiting or not) or the daemon stops. Its task
stays in place between tries, so there is one task per model at most; posting
its URL again starts the next try at once.

A preload is kept: once cached, its entries are pinned against eviction
(pins.py), and if its files leave the cache all the same (``CacheWatch`` sees
them gone) it is fetched again. A model added through the API is not pinned:
the cache's size limit may evict it for another, and posting it again brings it
back.

Every fetch runs with the daemon's ``HttpOptions`` and, given an allow-list, its
policy for that fetch (``AllowList.for_fetch``) as ``url_policy``, called on each
URL the source is about to request: the model's, each shard's and each redirect
target's. A refused URL fails the model with
``UrlNotAllowedError``, the URL named with its secrets redacted.

Sharing the node: at most ``max_downloads`` models download at once, and the
waiting ones start highest ``priority`` first (priority.py); given a
``Bandwidth`` (``--max-bandwidth``), every fetch takes its bytes from it, at
its model's priority (bandwidth.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import CacheError, ClosedError
from ..redact import redacting_logger
from ..runtime.pace import PACE
from ..settings.values import HttpOptions
from .allow import AllowList
from .bandwidth import Bandwidth
from .metrics import Metrics
from .pins import Pins
from .priority import PriorityGate
from .retry import Backoff
from .state import ModelRecord, Registry, display_url

if TYPE_CHECKING:
    from ..cache import CachedModel, ModelCache

__all__ = ["Downloads"]

logger = redacting_logger(__name__)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class Downloads:
    """Runs cache fetches for models of a Registry.

    Args:
        cache: a ``ModelCache``.
        registry: where each model's progress and outcome are recorded.
        metrics: counters to update.
        concurrency: reads in flight per download (None: the cache's default).
        max_downloads: models downloading at once; the others wait as ``queued``
            and start highest ``priority`` first.
        http: options of every fetch.
        allow: the URLs a fetch may request (None or empty: any).
        after_fetch: awaited after each fetch that reached the cache, before its
            model is marked ready (the fetch may have evicted other models' files).
        backoff: delays between the tries of a failed model (None: no retries).
        bandwidth: the cap all fetches share (None: no cap).
        pins: where preloads are held against eviction once cached (None: not held).
        coordinator: fetches through peer daemons first (aioloader/swarm/coordinator.py;
            None: from the origin only).

    Use as ``async with Downloads(...) as downloads:`` inside the server's task.
    """

    def __init__(
        self,
        cache: ModelCache,
        registry: Registry,
        metrics: Metrics,
        *,
        concurrency: int | None = None,
        max_downloads: int = 2,
        http: HttpOptions | None = None,
        allow: AllowList | None = None,
        after_fetch: Callable[[], Awaitable[None]] | None = None,
        backoff: Backoff | None = None,
        bandwidth: Bandwidth | None = None,
        pins: Pins | None = None,
        coordinator: Any = None,
    ) -> None:
        self._cache = cache
        self._coordinator = coordinator
        self._pins = pins
        self._registry = registry
        self._metrics = metrics
        self._concurrency = concurrency
        self._http = http or HttpOptions()
        self._allow = allow
        self._after_fetch = after_fetch
        self._backoff = backoff
        self._wake: dict[str, asyncio.Event] = {}  # failed models waiting for their next try
        self._bandwidth = bandwidth
        self._slots = PriorityGate(max_downloads)
        self._group = asyncio.TaskGroup()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._open = False
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._open else "new"
        return f"<Downloads {state} running={len(self._tasks)}>"

    def statistics(self) -> dict[str, int]:
        return {"tasks": len(self._tasks), "waiting": self._slots.waiting}

    async def __aenter__(self) -> Downloads:
        await self._group.__aenter__()
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        for task in self._tasks.values():
            task.cancel()
        # Each task records its own failure, so the group never has one to raise;
        # an exception from the body passes through unwrapped.
        await self._group.__aexit__(None, None, None)

    def close(self) -> None:
        """Refuse new downloads from now on (running ones continue until exit)."""
        self._closed = True

    @property
    def accepting(self) -> bool:
        return self._open and not self._closed

    def running(self, model_id: str) -> bool:
        return model_id in self._tasks

    def submit(self, record: ModelRecord) -> bool:
        """Start fetching ``record`` unless it is running or ready; True if started.

        Raises:
            ClosedError: the daemon is shutting down.
        """
        if not self.accepting:
            raise ClosedError("the daemon is shutting down; no new downloads")
        if record.status == "ready":
            return False
        waiting = self._wake.get(record.id)
        if waiting is not None:  # a failed model between tries: try now
            waiting.set()
            return True
        if record.id in self._tasks:
            return False
        record.queue()
        self._tasks[record.id] = self._group.create_task(
            self._fetch(record), name=f"aioloader fetch {record.id}"
        )
        return True

    async def stop(self, seconds: float) -> list[str]:
        """Refuse new work, cancel every download, wait up to ``seconds``.

        Returns:
            The ids of downloads still stopping when the time ran out.
        """
        self.close()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=max(seconds, 0.0))
        return sorted(self._tasks)

    async def cancel(self, model_id: str) -> None:
        """Cancel the download of ``model_id`` (if any), wait until it stopped, and let
        go of its entries (a pinned preload's), so that they can be removed."""
        task = self._tasks.get(model_id)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        if self._pins is not None:
            self._pins.unpin(model_id)

    def refetch(self, record: ModelRecord) -> None:
        """``record``'s files left the cache (``CacheWatch``): fetch a preload again."""
        if self._pins is not None:
            self._pins.unpin(record.id)
        if record.preload and self.accepting:
            logger.warning(
                "%s (%s): a preload's files left the cache; fetching it again",
                display_url(record.url),
                record.id,
            )
            self.submit(record)

    async def _fetch(self, record: ModelRecord) -> None:
        try:
            while True:
                async with self._slots.slot(lambda: record.priority):
                    if await self._fetch_now(record):
                        return
                if self._backoff is None or self._closed:
                    return
                await self._wait_to_retry(record, self._backoff)
        finally:
            self._tasks.pop(record.id, None)

    async def _wait_to_retry(self, record: ModelRecord, backoff: Backoff) -> None:
        """Sleep until the failed model's next try (or a POST of its URL)."""
        delay = backoff.delay(record.failures)
        record.retry_in(delay)
        logger.warning(
            "%s (%s): failed %d time(s) in a row; next try in %.1f s",
            display_url(record.url),
            record.id,
            record.failures,
            delay,
        )
        wake = self._wake[record.id] = asyncio.Event()
        try:
            async with asyncio.timeout(delay):
                await wake.wait()
        except TimeoutError:
            pass
        finally:
            del self._wake[record.id]

    async def _fetch_now(self, record: ModelRecord) -> bool:
        """One try; records its outcome on ``record`` and returns whether it succeeded."""
        metrics = self._metrics
        record.start()
        metrics.in_flight.inc()
        started = time.monotonic()
        seen = 0

        def progress(done: int, total: int) -> None:
            nonlocal seen
            record.progress(done, total)
            metrics.progressed(done - seen)
            seen = done

        outcome = "error"
        paced = self._bandwidth.paced(lambda: record.priority) if self._bandwidth else None
        # ModelCache.fetch runs the fetch in a task of its own, which inherits this.
        pace_token = PACE.set(paced)
        try:
            http = self._http
            if self._allow:
                http = dataclasses.replace(http, url_policy=self._allow.for_fetch(record.where))
            kwargs: dict[str, Any] = {"progress": progress, "http": http}
            if self._concurrency is not None:
                kwargs["concurrency"] = self._concurrency
            logger.info("fetching %s (%s)", display_url(record.url), record.id)
            if self._pins is not None:
                self._pins.unpin(record.id)  # a new version may replace its files
            cached = await self._fetch_model(record, kwargs)
            if cached.hit and not await self._verify(cached):
                # Bit rot in an entry found in the cache: it was removed; fetch it again.
                logger.warning(
                    "%s (%s): cached bytes changed on disk; downloading again",
                    display_url(record.url),
                    record.id,
                )
                cached = await self._cache.fetch(record.where, **kwargs)
            if record.preload and self._pins is not None:
                cached = await self._pin(record, cached, kwargs)
            if self._after_fetch is not None:
                await self._after_fetch()
        except asyncio.CancelledError:
            outcome = "cancelled"
            record.fail(ClosedError("the download was cancelled"))
            raise
        except Exception as exc:
            error = _leaf(exc)
            record.fail(error)
            metrics.errors.labels(kind=type(error).__name__).inc()
            logger.warning("%s (%s) failed: %s", display_url(record.url), record.id, error)
            return False
        else:
            outcome = "hit" if cached.hit else "downloaded"
            (metrics.cache_hits if cached.hit else metrics.cache_misses).inc()
            metrics.bytes_fetched.inc(cached.downloaded)
            path = cached.path if isinstance(cached.path, str) else None
            record.succeed(
                nbytes=cached.bytes, hit=cached.hit, path=path, files=tuple(cached.files)
            )
            logger.info(
                "%s (%s) is cached: %d bytes, %s in %.2f s",
                display_url(record.url),
                record.id,
                record.bytes_done,
                outcome,
                time.monotonic() - started,
            )
            return True
        finally:
            PACE.reset(pace_token)
            metrics.in_flight.dec()
            metrics.load_seconds.labels(outcome=outcome).observe(time.monotonic() - started)

    async def _fetch_model(self, record: ModelRecord, kwargs: dict[str, Any]) -> CachedModel:
        """The cache's fetch, through the peers when there are any; counts where the
        model's bytes came from."""
        if self._coordinator is None:
            return await self._cache.fetch(record.where, **kwargs)
        from ..settings.options import LoadOptions
        from ..swarm.manifest import model_key

        try:
            settings = {k: v for k, v in kwargs.items() if k != "progress"}
            options = LoadOptions.build(**settings)
            cached: CachedModel = await self._coordinator.fetch(
                record.where, self._cache, options, kwargs["progress"]
            )
        finally:
            reads = self._coordinator.reads.get(model_key(record.url))
            if reads is not None:
                origin = reads.origin - (record.bytes_from_origin or 0)
                peers = reads.peers - (record.bytes_from_peers or 0)
                record.bytes_from_origin, record.bytes_from_peers = reads.origin, reads.peers
                self._metrics.model_bytes.labels(model=record.id, origin="origin").inc(
                    max(0, origin)
                )
                self._metrics.model_bytes.labels(model=record.id, origin="peers").inc(max(0, peers))
        return cached

    async def _pin(
        self, record: ModelRecord, cached: CachedModel, kwargs: dict[str, Any]
    ) -> CachedModel:
        """Hold the preload's entries against eviction; fetch again if another fetch
        evicted one between this fetch's end and the pin. Returns the model as pinned.

        Raises:
            CacheError: evicted again at once (the cache is far too small).
        """
        assert self._pins is not None
        if await self._pins.pin(record.id, list(cached.files)):
            return cached
        cached = await self._cache.fetch(record.where, **kwargs)
        if not await self._pins.pin(record.id, list(cached.files)):
            raise CacheError(
                f"{display_url(record.url)} was evicted from the cache as soon as it was "
                "fetched, twice; raise --max-cache-bytes so that the preloads fit"
            )
        return cached

    async def _verify(self, cached: CachedModel) -> bool:
        """Whether every file of a model found in the cache still hashes to the checksum
        recorded when it was written; corrupt entries are removed by the cache.

        Fresh downloads are not hashed again here: their checksum was computed from the
        bytes as they were written, moments ago.
        """
        results = await self._cache.verify(list(cached.files))
        return not any(r.status == "corrupt" for r in results)
