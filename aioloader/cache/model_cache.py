"""``ModelCache``: a node-local folder of remote model files, shared by processes.

Entries are keyed by the remote file's URL (see entry.py for what one holds).
``fetch`` makes every file of a model complete, downloading only missing byte
ranges; one process downloads an entry while fetches and loads elsewhere wait on
its ``lock`` file (a load waits only for a fetch, never for another load, and no
wait outlasts a holder without progress: claim.py, locks.py), and concurrent
fetches of one model in a process share one task. A
complete entry is reused only while the remote still reports the same size and
ETag (or Last-Modified when there is no ETag). With a cap (``max_bytes``, or
the one recorded in the folder: see eviction.py), the least recently used entries
are evicted before a new one is written and after it completes, except those a
process is downloading or reading. Every entry records a checksum of its bytes
(see checksum.py), which ``verify`` checks again.

The work itself lives in its rooms: fetch.py (downloads), eviction.py (the cap),
removal.py, verify.py and records.py (what it reports); this class holds the
settings, the counters and the fetches in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from ..errors import ConfigError
from ..redact import redact, redacting_logger
from ..runtime.threads import Lane, run_blocking
from ..settings.options import LoadKeywords, LoadOptions
from ..settings.resolver import resolve
from ..settings.table import CHECK_ETAG
from ..sinks import commits
from ..sources.stores import Location, locate
from .entry import EntryFiles, Meta, cache_error, read_meta
from .eviction import Eviction, list_entries
from .fetch import Progress, Supply, fetch_model
from .locks import STALL_SECONDS
from .records import CachedModel, CacheEntry, CacheStatistics, VerifyResult
from .removal import remove_entry
from .verify import verify_entry

__all__ = ["ModelCache"]

logger = redacting_logger(__name__)


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    bytes_downloaded: int = 0


@dataclass
class _Flight:
    task: asyncio.Task[CachedModel]
    waiters: int = 0


_NOT_FOR_FETCH = ("device", "framework", "group", "cache_dir")

# Roots whose "cannot cache here" warning was shown: once per process, not per load.
_warned_roots: set[str] = set()


class ModelCache:
    """A cache of remote model files in ``root``, shared by every process that uses it.

    Args:
        root: the cache folder (created when missing; it may be a symbolic link, but
            nothing below it may be).
        max_bytes: evict least recently used entries to stay under this many bytes on
            disk. It is recorded in the folder, and every process that uses the folder
            without a cap of its own holds it too (``None``: the recorded cap, if any).
        check_etag: check downloads from S3 against an ETag that is an MD5 (32 hex
            digits, as S3 sends for a single-part upload; objects under SSE-KMS or SSE-C
            are not checked). Turn it off for S3-compatible stores whose ETags look like
            MD5s but are not. Other servers' ETags are never taken for MD5s.
            ``None``: ``$AIOLOADER_CHECK_ETAG`` (``0``/``1``), on when unset.
        lock_stall: seconds a wait for an entry that another process is downloading
            tolerates that download showing no progress, before a ``CacheError``.

    ``fetch`` downloads; ``Loader(cache_dir=...)`` loads through the cache.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        check_etag: bool | None = None,
        lock_stall: float = STALL_SECONDS,
    ) -> None:
        if not isinstance(root, (str, os.PathLike)) or not os.fspath(root):
            raise ConfigError(
                f"the cache folder must be a non-empty path, not {root!r}; pass "
                "cache_dir=False (or leave AIOLOADER_CACHE_DIR unset) for no cache"
            )
        self.root = Path(root).expanduser().absolute()
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
        ):
            raise ConfigError(f"max_bytes must be a positive int or None, not {max_bytes!r}")
        if (
            isinstance(lock_stall, bool)
            or not isinstance(lock_stall, (int, float))
            or not math.isfinite(lock_stall)
            or lock_stall <= 0
        ):
            raise ConfigError(
                f"lock_stall must be a positive number of seconds, not {lock_stall!r}"
            )
        self.eviction = Eviction(self.root, max_bytes)
        self.check_etag = bool(resolve(CHECK_ETAG, check_etag))
        self.lock_stall = float(lock_stall)
        self._flights: dict[tuple[str, ...], _Flight] = {}
        self._counters = _Counters()

    def __repr__(self) -> str:
        c = self._counters
        return (
            f"<ModelCache {str(self.root)!r} max_bytes={self.max_bytes} hits={c.hits} "
            f"misses={c.misses} downloaded={c.bytes_downloaded}>"
        )

    def statistics(self) -> CacheStatistics:
        """Hits, misses, bytes downloaded and evictions of this object, as a snapshot."""
        c = self._counters
        return CacheStatistics(
            str(self.root), self.max_bytes, c.hits, c.misses, c.bytes_downloaded,
            self.eviction.evictions, len(self._flights),
        )  # fmt: skip

    @property
    def max_bytes(self) -> int | None:
        """This object's cap (``None``: the one recorded in the folder, if any)."""
        return self.eviction.max_bytes

    def entry_files(self, url: str) -> EntryFiles:
        return EntryFiles.of(self.root, url)

    # -- fetch -------------------------------------------------------------------------

    async def fetch(
        self,
        url: str | Sequence[str] | Location,
        *,
        progress: Progress | None = None,
        options: LoadOptions | None = None,
        supply: Supply | None = None,
        **keywords: Unpack[LoadKeywords],
    ) -> CachedModel:
        """Make every file of the model at ``url`` complete in the cache.

        Args:
            url: an ``http(s)://`` or ``s3://`` model, as ``load_model`` takes it (an
                index, an S3 prefix, a file, or a list of file URLs), or the ``Location``
                ``locate`` parsed it into (the daemon's, which its allow-list judged).
            progress: called as ``progress(bytes_done, bytes_total)`` as bytes arrive.
            options, keywords: as for ``Loader``, those that say how to read
                (``concurrency`` ranges of ``chunk_size`` bytes are downloaded at once;
                ``headers``, retries, ``s3_*``); where tensors would go (``device``,
                ``framework``, ``group``, ``cache_dir``) is refused.
            supply: where the files come from other than their origin (supply.py: the
                daemon's swarm, aioloader/swarm/supply.py); None: the origin alone.

        Returns:
            The CachedModel, with a local ``path`` that ``load_model`` reads directly.

        Raises:
            CacheError: the cache folder is full or not writable; a file name would
                leave the cache folder (checked before anything is downloaded); a
                download does not match the MD5 its server published.
            SourceError: the remote model could not be read (a partial download stays
                in the cache and the next fetch resumes it).
        """
        where = url if isinstance(url, Location) else locate(url)  # parsed once, here
        urls = (where.url,) if isinstance(where.url, str) else where.url
        flight = self._flights.get(urls)
        if flight is None or flight.task.done():
            for name in _NOT_FOR_FETCH:
                if keywords.get(name) is not None:
                    raise ConfigError(
                        f"ModelCache.fetch downloads into the cache; {name}= is for loads "
                        "(load_model, Loader), not for fetches"
                    )
            built = LoadOptions.build(options, **keywords)
            task = asyncio.get_running_loop().create_task(
                fetch_model(
                    self,
                    where,
                    built,
                    progress,
                    supply,
                ),
                name=f"aioloader cache fetch {urls[0]}",
            )
            flight = self._flights[urls] = _Flight(task)
            task.add_done_callback(lambda _: self._forget(urls, flight))
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                # Nobody wants the result any more: stop the download (it stays resumable).
                flight.task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait([flight.task])
            raise

    def _forget(self, urls: tuple[str, ...], flight: _Flight) -> None:
        if self._flights.get(urls) is flight:
            del self._flights[urls]
        if not flight.task.cancelled():
            flight.task.exception()  # retrieved by the waiters; never "never retrieved"

    # -- entries, removal ----------------------------------------------------------------

    def entries(self) -> list[CacheEntry]:
        """Every entry on disk, complete or partial, least recently used first.

        Reads the cache folder (blocking I/O: from async code, call it in a thread).
        """
        return list_entries(self.root)

    async def remove(self, url: str) -> bool:
        """Delete the entry of the file at ``url``; waits for a download of it to end.

        Returns:
            Whether there was an entry.

        Raises:
            CacheError: a load is reading the entry right now.
        """
        with Lane("cache", 1) as lane:  # the call's own: removal is used without a Loader
            return await remove_entry(self.entry_files(url), url, self.lock_stall, lane)

    async def recorded(self, url: str) -> Meta | None:
        """What the entry of ``url`` recorded when it completed (its size, the origin's
        ETag, its checksum); None when there is no complete entry. The daemon sends it
        with the file's bytes, so that a client can check what it copies."""
        files = self.entry_files(url)
        with Lane("cache", 1) as lane:
            meta = await run_blocking(lane, lambda: read_meta(files))
        return meta if meta is not None and meta.complete else None

    # -- verification ------------------------------------------------------------------

    async def verify(self, url: str | Sequence[str] | None = None) -> list[VerifyResult]:
        """Hash cached files again and compare with the checksums recorded when written.

        A file whose bytes changed on disk (bit rot, a stray write) is removed, with
        its links, and reported ``"corrupt"``; the next fetch or load downloads it
        again. Reads every byte checked, in a thread: seconds per GiB on a disk.

        Args:
            url: a file URL, or several (a model's ``CachedModel.files``); ``None``:
                every entry.

        Files that loads in this process finished but whose commit is still running
        (see ``wait_committed``) are checked once committed.

        Returns:
            One VerifyResult per file, in order; ``"missing"`` for a URL not cached.

        Raises:
            CacheError: the cache folder cannot be read.
        """
        await commits.wait(self.root)
        with Lane("cache", 1) as lane:  # the call's own: the daemon verifies without a Loader
            if url is None:
                entries = await run_blocking(lane, self.entries)
                targets = [(e.url, EntryFiles(self.root, Path(e.path))) for e in entries]
            else:
                urls = [url] if isinstance(url, str) else list(url)
                targets = [(redact(u), self.entry_files(u)) for u in urls]
            return [await verify_entry(files, u, self.lock_stall, lane) for u, files in targets]

    async def wait_committed(self) -> None:
        """Wait for the entries that loads through this cache finished to be committed.

        A load returns its tensors before its new entries are hashed, synced and
        renamed into place (that happens in the background, and a process that
        exits normally waits for it). Call this to know they are complete, for
        example before copying the cache folder elsewhere.
        """
        await commits.wait(self.root)

    def warn_uncached(self, exc: OSError, url: str) -> None:
        """Say once per process that this cache cannot take files, and why."""
        if str(self.root) in _warned_roots:
            logger.debug("model cache %s: not caching %s: %s", self.root, url, exc)
            return
        _warned_roots.add(str(self.root))
        error = cache_error(exc, self.root, f"caching {url}")
        logger.warning("%s. Loading from the remote without caching (this is said once)", error)

    def record_download(self, nbytes: int) -> None:
        self._counters.bytes_downloaded += nbytes

    def record(self, *, hit: bool, downloaded: int = 0) -> None:
        if hit:
            self._counters.hits += 1
        else:
            self._counters.misses += 1
        self._counters.bytes_downloaded += downloaded
