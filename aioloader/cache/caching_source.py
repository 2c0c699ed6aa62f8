"""Loading through the cache: a Source that serves complete entries from disk and
writes what it reads from the remote into the cache as it goes.

``CachingSource`` wraps a remote Source. Opening a file probes the remote (one
request: size and ETag), then:

* the entry is complete and the same version: the local file is read instead,
  holding the entry's ``use`` lock (shared) so that eviction leaves it alone;
* otherwise, when no other process is downloading it: a ``FillingBlob`` reads from
  the remote and its ``EntrySink`` writes the same bytes into the entry's partial
  file (sink.py; sinks/), before each read returns for staged (GPU) loads, whose
  buffers are reused at once, or after the load for loads into host memory;
* otherwise the remote blob is returned as it is.

When the cache cannot take the bytes (a full disk, a quota, a read-only or
foreign folder: see ``no_room``), the load goes on from the remote alone, with
one warning per process, and the entry's partial files are deleted. A lock or
a partial file is never left open by a cancelled load: each is released in the
``finally`` of the code that took it, or by ``on_abandon`` when a thread took it
after its caller was cancelled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import CacheError, ClosedError
from ..redact import redacting_logger
from ..runtime.threads import Lane, Lanes, run_blocking
from ..sinks.filling_blob import FillingBlob
from ..sources.base import Blob, CacheOutcome, ForwardingBlob, Source, aclose_all
from ..sources.file import FileSource
from .claim import BUSY, Claim, claim
from .entry import EntryFiles, Version, cache_error, discard_quietly, no_room, version_of
from .locks import FileLock, acquire
from .partial import PartialFile
from .protocol import CacheProtocol
from .sink import EntrySink

__all__ = ["CachingSource"]

logger = redacting_logger(__name__)

T = TypeVar("T")


class _LocalBlob(ForwardingBlob):
    """A complete entry's data, read under the remote URL while holding its ``use`` lock."""

    def __init__(
        self,
        source: CachingSource,
        url: str,
        local: Blob,
        use: FileLock | None,
        version: Version,
    ) -> None:
        super().__init__(local)
        self.url = url
        self.etag = version.etag  # the remote's version, for the ranks of a group
        self.last_modified = version.last_modified
        self._source = source
        self._use = use
        source.track(self)

    def __repr__(self) -> str:
        return f"<cached {self.inner!r} for {self.url!r}>"

    @property
    def cache_outcome(self) -> CacheOutcome | None:
        return "hit"

    async def check_unchanged(self) -> None:
        """Nothing to check: the entry is complete, and its ``use`` lock keeps eviction
        away (without one, the descriptor keeps the bytes that were opened)."""

    async def aclose(self) -> None:
        self._source.untrack(self)
        try:
            await self.inner.aclose()
        finally:
            if self._use is not None:
                self._use.release()


class CachingSource(Source):
    """A remote Source read through a node cache (see the module docstring).

    Args:
        inner: the remote Source (HTTP or S3).
        cache: the cache to read from and fill.
        lanes: the owner's threads (threads.py): local reads go to its file lanes, the
            cache's file work to its ``cache`` lane; the owner closes them after this.
        write_after: the buffers reads land in are the caller's tensors, which stay
            as they are: write them after the load; else each read is written before
            it returns, in the ``cache`` lane (sinks/filling_blob.py).

    ``inner`` and ``lanes`` belong to the caller and stay open.
    """

    def __init__(
        self, inner: Source, cache: CacheProtocol, *, lanes: Lanes, write_after: bool = False
    ) -> None:
        self.inner = inner
        self.cache = cache
        self.write_after = write_after
        self.lanes = lanes
        self._through: Lane | None = None if write_after else lanes.cache
        self._local: FileSource | None = None
        self._closed = False
        # Blobs handed out and not closed yet: closed with the source at the latest,
        # so a caller that lost one (cancelled mid-cleanup) leaks no lock for long.
        self._open_blobs: set[Blob] = set()

    def __repr__(self) -> str:
        return f"<CachingSource {self.inner!r} cache={self.cache!r}>"

    def _pool(self) -> Lane:
        if self._closed:
            raise ClosedError("this CachingSource is closed")
        return self.lanes.cache

    def track(self, blob: Blob) -> None:
        """Count ``blob`` as handed out: ``aclose`` closes it if its caller does not."""
        self._open_blobs.add(blob)

    def untrack(self, blob: Blob) -> None:
        """``blob`` is being closed by its caller."""
        self._open_blobs.discard(blob)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (local reads, cache writes) in the ``cache`` lane.

        Raises:
            ClosedError: the source is closed.
        """
        return await run_blocking(self._pool(), fn)

    def _local_source(self) -> FileSource:
        if self._local is None:
            self._local = FileSource(self.lanes)
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
        if blob is not remote and not isinstance(blob, FillingBlob):
            try:
                await remote.aclose()
            except BaseException:
                await blob.aclose()
                raise
        return blob

    async def _blocking(self, fn: Callable[[], T], url: str, doing: str) -> T:
        try:
            return await self.run(fn)
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
        sink = EntrySink(self.cache, url, partial, lock, run=self.run, untrack=self.untrack)
        blob = FillingBlob(remote, sink, through=self._through)
        self.track(blob)
        return blob

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
            lane = self.lanes.cache
            stall = self.cache.lock_stall
            return await acquire(files.use, exclusive=False, executor=lane, stall=stall, what=url)
        except OSError as exc:
            if not no_room(exc):
                raise cache_error(exc, self.cache.root, f"holding {url}") from exc
            return None

    async def _prepare(self, url: str, files: EntryFiles, version: Version) -> PartialFile | None:
        """The entry's partial file, under its lock; None when the cache has no room."""
        try:
            await self.cache.eviction.make_room(files, version.size, set(), self.lanes.cache)
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
        await self.run(lambda: discard_quietly(files))
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
            if local is not None:
                await local.aclose()
