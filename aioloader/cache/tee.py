"""Loading through the cache: a Source that serves complete entries from disk and
writes what it reads from the remote into the cache as it goes.

``CachingSource`` wraps a remote Source. Opening a file probes the remote (one
request: size and ETag), then:

* the entry is complete and the same version: the local file is read instead,
  holding the entry's ``use`` lock (shared) so that eviction leaves it alone;
* otherwise, when no other process is downloading it: a ``_TeeBlob`` reads from
  the remote and writes the same bytes into the entry's partial file, so one
  network read serves both. Ranges already in a partial file are read locally.
  Once every byte has been written (a full load reads them all), closing the
  blob completes the entry; a partial load leaves it resumable;
* otherwise the remote blob is returned as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._threads import run_blocking
from ..errors import CacheError, ClosedError
from ..sources.base import Blob, Source
from ..sources.file import FileSource
from .entry import PartialFile, cache_error, clip
from .fetch import version_of
from .locks import FileLock, acquire, try_acquire
from .store import ModelCache

__all__ = ["CachingSource"]

logger = logging.getLogger("aioloader")


class _LocalBlob(Blob):
    """A complete entry's data, read under the remote URL while holding its ``use`` lock."""

    def __init__(self, url: str, local: Blob, use: FileLock) -> None:
        self.url = url
        self.size = local.size
        self._local = local
        self._use = use

    def __repr__(self) -> str:
        return f"<cached {self._local!r} for {self.url!r}>"

    async def read_bytes(self, offset: int, length: int) -> bytes:
        return await self._local.read_bytes(offset, length)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self._local.read_into(offset, buffers)

    async def aclose(self) -> None:
        try:
            await self._local.aclose()
        finally:
            self._use.release()


class _TeeBlob(Blob):
    """A remote blob whose bytes are also written into the entry's partial file."""

    def __init__(
        self,
        source: CachingSource,
        remote: Blob,
        partial: PartialFile,
        lock: FileLock,
    ) -> None:
        self.url = remote.url
        self.size = remote.size
        self._source = source
        self._remote = remote
        self._partial = partial
        self._lock = lock
        self._closed = False

    def __repr__(self) -> str:
        return f"<caching {self._remote!r} have={self._partial.done.total}/{self.size}>"

    async def _blocking(self, fn: Callable[[], Any], doing: str) -> Any:
        if self._closed:
            raise ClosedError(f"{self.url} was already closed")
        return await self._source._blocking(fn, self.url, doing)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        partial = self._partial
        end = offset + sum(b.nbytes for b in clip(buffers, self.size - offset))
        if partial.covers(offset, end):
            await self._blocking(lambda: partial.read(offset, buffers), "reading the cache of")
            return
        await self._remote.read_into(offset, buffers)
        self._source.cache._count_download(end - offset)
        await self._blocking(lambda: partial.write(offset, buffers), "writing")

    async def aclose(self) -> None:
        if self._closed:
            return
        partial = self._partial
        try:
            await self._remote.aclose()
            if partial.finished:
                try:
                    await run_blocking(self._source._pool(), partial.complete)
                except OSError as exc:
                    # The tensors are loaded already: do not fail the load over it.
                    logger.warning("%s", cache_error(exc, self._source.cache.root, "completing"))
                else:
                    try:
                        await self._source.cache._after_complete(self.url)
                    except CacheError as exc:
                        logger.warning("%s", exc)
        finally:
            self._closed = True
            partial.close()
            self._lock.release()


class CachingSource(Source):
    """A remote Source read through a ModelCache (see the module docstring).

    Args:
        inner: the remote Source (HTTP or S3).
        cache: the cache to read from and fill.
        threads: threads for local reads and cache writes, normally ``concurrency``.

    ``aclose`` releases the threads; ``inner`` belongs to the caller and stays open.
    """

    def __init__(self, inner: Source, cache: ModelCache, *, threads: int) -> None:
        self.inner = inner
        self.cache = cache
        self._threads = threads
        self._local: FileSource | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<CachingSource {self.inner!r} cache={self.cache!r}>"

    def _pool(self) -> ThreadPoolExecutor:
        if self._closed:
            raise ClosedError("this CachingSource is closed")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="aioloader-cache")
        return self._executor

    def _local_source(self) -> FileSource:
        if self._local is None:
            self._local = FileSource(self._threads)
        return self._local

    async def list_dir(self, url: str) -> list[str] | None:
        return await self.inner.list_dir(url)

    def join(self, base: str, name: str) -> str:
        return self.inner.join(base, name)

    def parent(self, url: str) -> str:
        return self.inner.parent(url)

    async def open(self, url: str) -> Blob:
        remote = await self.inner.open(url)
        try:
            blob = await self._open_cached(url, remote)
        except BaseException:
            await remote.aclose()
            raise
        if blob is not remote and not isinstance(blob, _TeeBlob):
            await remote.aclose()
        return blob

    async def _blocking(self, fn: Callable[[], Any], url: str, doing: str) -> Any:
        try:
            return await run_blocking(self._pool(), fn)
        except OSError as exc:
            raise cache_error(exc, self.cache.root, f"{doing} {url}") from exc

    async def _open_cached(self, url: str, remote: Blob) -> Blob:
        cache = self.cache
        files = cache.entry_files(url)
        version = version_of(remote)
        if await self._blocking(lambda: files.complete_for(version), url, "checking"):
            use = await acquire(files.use, exclusive=False)
            try:
                meta = await self._blocking(lambda: files.complete_for(version), url, "checking")
                if meta is not None:
                    await self._blocking(lambda: files.touch(meta), url, "updating")
                    local = await self._local_source().open(str(files.data))
                    cache._count(hit=True)
                    return _LocalBlob(url, local, use)
            except BaseException:
                use.release()
                raise
            use.release()  # evicted meanwhile: fetch it again
        await self._blocking(files.make, url, "creating the entry of")
        lock = await self._blocking(lambda: try_acquire(files.lock, exclusive=True), url, "locking")
        if lock is None:
            # Another process is downloading this file: wait for it to finish rather
            # than download the same bytes twice, then read its copy.
            lock = await acquire(files.lock, exclusive=True)
            if await self._blocking(lambda: files.complete_for(version), url, "checking"):
                lock.release()
                return await self._open_cached(url, remote)
        try:
            partial = await self._blocking(
                lambda: PartialFile.open(files, url, version), url, "preparing"
            )
        except BaseException:
            lock.release()
            raise
        cache._count(hit=False)
        return _TeeBlob(self, remote, partial, lock)

    async def aclose(self) -> None:
        self._closed = True
        local, self._local = self._local, None
        if local is not None:
            await local.aclose()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
