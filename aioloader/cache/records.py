"""What the cache reports: entries, counters and fetched models."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from ..errors import CacheError, LoaderError
from ..runtime.small_files import read_json
from ..runtime.threads import Lane, run_blocking
from .entry import EntryFiles, Meta
from .locks import FileLock, acquire

__all__ = ["CacheEntry", "CacheStatistics", "CachedModel", "VerifyResult"]


@dataclass(frozen=True)
class CacheEntry:
    """One cached file, as ``ModelCache.entries()`` reports it.

    Attributes:
        url: the remote file.
        size: its size in bytes.
        complete: whether every byte is in the cache (else a resumable partial download).
        last_used: when it was last fetched or loaded (seconds since the epoch).
        bytes_on_disk: disk space it takes now.
        etag: the remote version it holds.
        path: the entry's folder.
    """

    url: str
    size: int
    complete: bool
    last_used: float
    bytes_on_disk: int
    etag: str | None
    path: str


@dataclass(frozen=True)
class VerifyResult:
    """What ``ModelCache.verify`` found for one file.

    Attributes:
        url: the remote file.
        status: ``"ok"`` (its bytes hash to the checksum recorded when they were
            written), ``"corrupt"`` (they changed on disk), ``"unchecked"`` (no
            checksum was recorded: written by an older aioloader), ``"partial"``
            (still downloading or abandoned) or ``"missing"`` (no entry).
        detail: what was found, in words.
        removed: a corrupt entry was deleted (the next fetch or load downloads it).
    """

    url: str
    status: Literal["ok", "corrupt", "unchecked", "partial", "missing"]
    detail: str
    removed: bool = False

    @property
    def ok(self) -> bool:
        """Whether the entry is complete and its bytes are those written."""
        return self.status == "ok"


@dataclass(frozen=True)
class CacheStatistics:
    """Counters of one ModelCache object since it was created (files, not models)."""

    root: str
    max_bytes: int | None
    hits: int
    misses: int
    bytes_downloaded: int
    evictions: int
    fetches_in_flight: int


@dataclass(frozen=True)
class CachedModel:
    """A model whose files are all complete in the cache.

    Attributes:
        url: what was fetched.
        path: a local layout to pass to ``load_model``: the index, the folder or the
            file under ``<root>/models/``, whose files link to the entries' data.
        files: remote file URL -> the local file holding its bytes.
        bytes: total size of the model's files.
        hit: True when nothing had to be downloaded.
        downloaded: bytes this fetch downloaded.
    """

    url: str
    path: str | list[str]
    files: dict[str, str]
    bytes: int
    hit: bool
    downloaded: int
    _entries: tuple[EntryFiles, ...] = field(default=(), repr=False, compare=False)

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[CachedModel]:
        """Hold the model's entries against eviction while loading from ``path``.

        Raises:
            CacheError: an entry was evicted or removed since the fetch; fetch again.
        """
        held: list[FileLock] = []
        # Its own lane, for the few checks here: the model is used without a Loader.
        lane = Lane("cache", 1)
        try:
            for files in self._entries:
                held.append(await acquire(files.use, exclusive=False, executor=lane))
                meta = await _read_meta(files, lane)
                if (
                    meta is None
                    or not meta.complete
                    or not await run_blocking(lane, files.data.exists)
                ):
                    raise CacheError(
                        f"model cache {files.root}: {meta.url if meta else files.dir} was "
                        f"evicted or removed after {self.url} was fetched; fetch it again"
                    )
            yield self
        finally:
            for lock in held:
                lock.release()
            lane.shutdown(wait=True)


async def _read_meta(files: EntryFiles, lane: Lane) -> Meta | None:
    """The entry's ``meta.json`` (with aiofiles, in ``lane``); None when it is missing or
    unreadable, which the entry treats as absent (as ``entry.read_meta``)."""
    try:
        return Meta(**await read_json(files.meta, lane))
    except (LoaderError, TypeError):
        return None
