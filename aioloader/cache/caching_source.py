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
  blob hands the entry to a commit thread, which completes it after the load
  has returned (commit.py); a partial load leaves it resumable;
* into host memory (``write_after``), a read returns as soon as its bytes have
  arrived and their digest is taken; its write waits until the blob is closed,
  when the load's reads are over, and runs in writer threads while the commit
  waits for it. The load goes at the remote's speed with no disk write in it
  (docs/benchmarks.md). A tensor changed in place before its bytes were written
  costs the entry (the commit checks each range against its digest, partial.py),
  never its correctness; the memory of the tensors stays alive until written.
  Staged (GPU) loads reuse their buffers at once and write before each read
  returns;
* otherwise the remote blob is returned as it is.

When the cache cannot take the bytes (a full disk, a quota, a read-only or
foreign folder: see ``no_room``), the load goes on from the remote alone, with
one warning per process, and the entry's partial files are deleted. A lock or
a partial file is never left open by a cancelled load: each is released in the
``finally`` of the code that took it, or by ``on_abandon`` when a thread took it
after its caller was cancelled.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any

from .._threads import SharedPool, run_blocking
from ..errors import CacheError, ClosedError
from ..sources.base import Blob, Source, aclose_all
from ..sources.file import FileSource
from . import commit
from .claim import BUSY, Claim, claim
from .entry import EntryFiles, Version, cache_error, no_room
from .fetch import version_of
from .locks import FileLock, acquire
from .partial import PartialFile, RangeMismatch, clip, range_digest
from .protocol import CacheProtocol
from .ranges import RangeSet

__all__ = ["CachingSource"]

logger = logging.getLogger("aioloader")

# Writer threads for the writes after a load, shared by the process: O_DIRECT writes
# of whole reads, so a handful keeps the disk's queue full. A process that exits
# normally finishes the writes (and the commits waiting for them).
_writers = SharedPool(8, "aioloader-cache-write")


class _LocalBlob(Blob):
    """A complete entry's data, read under the remote URL while holding its ``use`` lock."""

    def __init__(
        self,
        source: CachingSource,
        url: str,
        local: Blob,
        use: FileLock | None,
        version: Version,
    ) -> None:
        self.url = url
        self.size = local.size
        self.etag = version.etag  # the version, for the ranks of a group
        self.last_modified = version.last_modified
        self._source = source
        self._local = local
        self._use = use
        source._open_blobs.add(self)

    def __repr__(self) -> str:
        return f"<cached {self._local!r} for {self.url!r}>"

    async def read_bytes(self, offset: int, length: int) -> bytes:
        return await self._local.read_bytes(offset, length)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self._local.read_into(offset, buffers)

    async def aclose(self) -> None:
        self._source._open_blobs.discard(self)
        try:
            await self._local.aclose()
        finally:
            if self._use is not None:
                self._use.release()


def _discard_quietly(files: EntryFiles) -> None:
    """Delete an entry's bytes when the cache gave up on it (a read-only one keeps them)."""
    with contextlib.suppress(OSError):
        files.discard()


class _TeeBlob(Blob):
    """A remote blob whose bytes are also written into the entry's partial file.

    When a write finds the cache full, the blob stops caching (``_partial`` is
    None) and reads on from the remote; ``aclose`` then deletes the partial files.
    """

    def __init__(
        self,
        source: CachingSource,
        remote: Blob,
        partial: PartialFile,
        lock: Claim,
    ) -> None:
        self.url = remote.url
        self.size = remote.size
        self.etag = getattr(remote, "etag", None)  # the version, for the ranks of a group
        self.last_modified = getattr(remote, "last_modified", None)
        self._source = source
        self._remote = remote
        self._partial: PartialFile | None = partial
        self._owned = partial
        self._lock = lock
        self._closed = False
        self._after = source.write_after
        # Ranges received and not written yet, with their digests on arrival.
        self._queued: list[tuple[int, list[memoryview], str]] = []
        self._write_error: OSError | None = None  # the first a writer thread met
        source._open_blobs.add(self)

    def __repr__(self) -> str:
        have = self._partial.done.total if self._partial is not None else "uncached"
        return f"<caching {self._remote!r} have={have}/{self.size}>"

    async def _blocking(self, fn: Callable[[], Any]) -> Any:
        if self._closed:
            raise ClosedError(f"{self.url} was already closed")
        return await run_blocking(self._source._pool(), fn)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        partial = self._partial
        if partial is None:
            await self._remote.read_into(offset, buffers)
            return
        end = offset + sum(b.nbytes for b in clip(buffers, self.size - offset))
        root = self._source.cache.root
        if partial.covers(offset, end):
            try:
                await self._blocking(lambda: partial.read(offset, buffers))
            except OSError as exc:
                raise cache_error(exc, root, f"reading the cache of {self.url}") from exc
            return
        await self._remote.read_into(offset, buffers)
        self._lock.beat()
        self._source.cache.record_download(end - offset)
        if self._after:
            if end > offset:
                views = clip(buffers, self.size - offset)
                digest = await self._blocking(lambda: range_digest(views))
                self._queued.append((offset, views, digest))
            return
        try:
            await self._blocking(lambda: partial.write(offset, buffers))
        except OSError as exc:
            if not no_room(exc):
                raise cache_error(exc, root, f"writing {self.url}") from exc
            # The bytes are in the caller's buffers already: only the cache gives up.
            self._partial = None
            self._source.cache.warn_uncached(exc, self.url)

    def received(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Bytes of this file that reached the caller another way (another rank of a
        ``group=`` load sent them): cached as if read here, so that the entry completes
        though this process read only its share. They are the caller's tensors, which
        stay alive until written, like ``write_after``'s. Blocking (takes their digest)
        and safe beside reads: called from the exchange's thread."""
        partial = self._partial
        if partial is None or self._closed:
            return
        views = clip(buffers, self.size - offset)
        end = offset + sum(v.nbytes for v in views)
        if end > offset and not partial.covers(offset, end):
            self._queued.append((offset, views, range_digest(views)))

    def _write_queued(
        self, partial: PartialFile, offset: int, views: list[memoryview], digest: str
    ) -> None:
        """One read's bytes into the partial file (in a writer thread)."""
        if self._write_error is not None:
            return  # the cache has given up on this file
        try:
            partial.write(offset, views, digest)
        except OSError as exc:
            if self._write_error is None:
                self._write_error = exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._source._open_blobs.discard(self)
        handed_off = False
        try:
            await self._remote.aclose()
            partial = self._partial
            if partial is not None:
                # The tensors are out: what is left (writing the queued ranges, then
                # completing the entry if every byte is there) need not hold the load
                # up, and runs after it (commit.py).
                queued, self._queued = self._queued, []
                writes = [_writers.get().submit(self._write_queued, partial, *j) for j in queued]
                submitted = RangeSet(
                    (offset, offset + sum(v.nbytes for v in views)) for offset, views, _ in queued
                )
                finished = partial.covered_with(submitted)
                if finished or writes:
                    # From here the holder waits for nothing else: other loads may wait.
                    with contextlib.suppress(OSError):
                        self._lock.mark(partial.files)
                    root = self._source.cache.root
                    commit.submit(root, lambda: self._settle(partial, writes, finished))
                    handed_off = True
        finally:
            self._closed = True
            if not handed_off:
                try:
                    if self._partial is None:
                        # The cache gave up on this file: leave none of it behind.
                        await run_blocking(self._source._pool(), self._discard)
                finally:
                    self._owned.close()
                    self._lock.release()

    def _discard(self) -> None:
        self._owned.close()
        _discard_quietly(self._owned.files)

    def _settle(self, partial: PartialFile, writes: list[Future[None]], finished: bool) -> None:
        """Wait for the queued writes, complete the entry when ``finished`` (else it stays
        resumable), then let it go: in a commit thread, so errors are logged."""
        cache = self._source.cache
        try:
            wait_all(writes)
            if self._write_error is not None:
                raise self._write_error
            if finished:
                partial.complete()
        except RangeMismatch as exc:
            logger.warning("model cache %s: %s; not caching %s", cache.root, exc, self.url)
            self._discard()
        except OSError as exc:
            # The tensors are loaded already: nothing to fail but the entry.
            if no_room(exc):
                cache.warn_uncached(exc, self.url)
                self._discard()
            else:
                logger.warning("%s", cache_error(exc, cache.root, f"completing {self.url}"))
        except Exception:
            logger.exception("completing the cache entry of %s failed", self.url)
        else:
            if finished:
                try:
                    cache.after_complete(self.url)
                except CacheError as exc:
                    logger.warning("%s", exc)
        finally:
            self._owned.close()
            self._lock.release()


class CachingSource(Source):
    """A remote Source read through a node cache (see the module docstring).

    Args:
        inner: the remote Source (HTTP or S3).
        cache: the cache to read from and fill.
        threads: threads for local reads and cache writes, normally ``concurrency``.
        write_after: the buffers reads land in are the caller's tensors, which stay
            as they are: write them after the load (see the module docstring).

    ``aclose`` releases the threads; ``inner`` belongs to the caller and stays open.
    """

    def __init__(
        self, inner: Source, cache: CacheProtocol, *, threads: int, write_after: bool = False
    ) -> None:
        self.inner = inner
        self.cache = cache
        self.write_after = write_after
        self._threads = threads
        self._local: FileSource | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        # Blobs handed out and not closed yet: closed with the source at the latest,
        # so a caller that lost one (cancelled mid-cleanup) leaks no lock for long.
        self._open_blobs: set[_LocalBlob | _TeeBlob] = set()

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
            try:
                await remote.aclose()
            except BaseException:
                await blob.aclose()
                raise
        return blob

    async def _blocking(self, fn: Callable[[], Any], url: str, doing: str) -> Any:
        try:
            return await run_blocking(self._pool(), fn)
        except OSError as exc:
            raise cache_error(exc, self.cache.root, f"{doing} {url}") from exc

    async def _open_cached(self, url: str, remote: Blob) -> Blob:
        files = self.cache.entry_files(url)
        version = version_of(remote)
        while True:
            local = await self._open_local(url, files, version)
            if local is not None:
                return local
            try:
                held = await claim(
                    files, version, self._pool(), by="load", stall=self.cache.lock_stall, url=url
                )
            except OSError as exc:
                if not no_room(exc):
                    raise cache_error(exc, self.cache.root, f"locking {url}") from exc
                self.cache.warn_uncached(exc, url)
                return remote
            if held is BUSY:
                # Another load is writing this entry: waiting for it could close a cycle
                # (claim.py). Its bytes come from the remote this time, uncached.
                logger.debug("%s: another load is caching it; reading it uncached", url)
                return remote
            if isinstance(held, Claim):
                lock = held
                break
        try:
            partial = await self._prepare(url, files, version)
        except BaseException:
            lock.release()
            raise
        if partial is None:
            lock.release()
            return remote
        partial.heartbeat = lock.beat
        self.cache.record(hit=False)
        return _TeeBlob(self, remote, partial, lock)

    async def _open_local(self, url: str, files: EntryFiles, version: Version) -> Blob | None:
        """The complete entry of ``version``, held by its ``use`` lock; else None."""
        if not await self._blocking(lambda: files.complete_for(version), url, "checking"):
            return None
        use = await self._hold(url, files)
        try:
            meta = await self._blocking(lambda: files.complete_for(version), url, "checking")
            if meta is None:
                if use is not None:
                    use.release()  # evicted meanwhile: fetch it again
                return None
            await self._blocking(lambda: files.touch(meta), url, "updating")
            local = await self._local_source().open(str(files.data))
        except BaseException:
            if use is not None:
                use.release()
            raise
        self.cache.record(hit=True)
        return _LocalBlob(self, url, local, use, version)

    async def _hold(self, url: str, files: EntryFiles) -> FileLock | None:
        """The entry's ``use`` lock (shared); None in a cache this process cannot write.

        Without it, eviction by another process may delete the file while it is read,
        but the descriptor opened next keeps its bytes readable until the load ends.
        """
        try:
            return await acquire(files.use, exclusive=False, stall=self.cache.lock_stall, what=url)
        except OSError as exc:
            if not no_room(exc):
                raise cache_error(exc, self.cache.root, f"holding {url}") from exc
            return None

    async def _prepare(self, url: str, files: EntryFiles, version: Version) -> PartialFile | None:
        """The entry's partial file, under its lock; None when the cache has no room."""
        try:
            await self.cache.make_room(files, version.size, set())
        except CacheError as exc:
            logger.warning("%s", exc)  # other entries stay; this load goes on
        try:
            return await run_blocking(
                self._pool(),
                lambda: PartialFile.open(files, url, version, direct=True),
                on_abandon=PartialFile.close,
            )
        except OSError as exc:
            if not no_room(exc):
                raise cache_error(exc, self.cache.root, f"preparing {url}") from exc
            problem = exc
        await run_blocking(self._pool(), lambda: _discard_quietly(files))
        self.cache.warn_uncached(problem, url)
        return None

    async def aclose(self) -> None:
        try:
            if self._open_blobs:
                logger.debug("%r: closing %d blobs left open", self, len(self._open_blobs))
                await aclose_all(list(self._open_blobs))
        finally:
            self._closed = True
            local, self._local = self._local, None
            try:
                if local is not None:
                    await local.aclose()
            finally:
                executor, self._executor = self._executor, None
                if executor is not None:
                    executor.shutdown(wait=True)
