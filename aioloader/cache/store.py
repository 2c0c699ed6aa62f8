"""``ModelCache``: a node-local folder of remote model files, shared by processes.

Entries are keyed by the remote file's URL (see entry.py for what one holds).
``fetch`` makes every file of a model complete, downloading only missing byte
ranges; one process downloads an entry while the others wait on its ``lock``
file, and concurrent fetches of one model in a process share one task. A
complete entry is reused only while the remote still reports the same size and
ETag (or Last-Modified when there is no ETag). With ``max_bytes``, the least
recently used complete entries are evicted after each fetch, except those a
reader holds through their ``use`` lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from .._threads import run_blocking
from ..config import HttpOptions, Limits, S3Options
from ..errors import CacheError, ConfigError
from ..layout import ModelLayout, resolve_layout
from ..sources.auto import scheme_of, source_for
from ..sources.base import Source
from .entry import EntryFiles, cache_error, key_of, read_meta
from .fetch import Progress, _Fetcher, _Meter, _Options
from .info import CachedModel, CacheEntry, CacheStatistics
from .locks import acquire, try_acquire

__all__ = ["ModelCache"]

logger = logging.getLogger("aioloader")

REMOTE_SCHEMES = frozenset({"http", "https", "s3"})


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    bytes_downloaded: int = 0
    evictions: int = 0


@dataclass
class _Flight:
    task: asyncio.Task[CachedModel]
    waiters: int = 0


def _basename(url: str) -> str:
    return unquote(urlparse(url).path.rstrip("/").rsplit("/", 1)[-1]) or "model"


class ModelCache:
    """A cache of remote model files in ``root``, shared by every process that uses it.

    Args:
        root: the cache folder (created when missing).
        max_bytes: evict least recently used entries to stay under this many bytes on
            disk (``None``: never evict).

    ``fetch`` downloads; ``Loader(cache_dir=...)`` loads through the cache.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        if max_bytes is not None and max_bytes < 0:
            raise ConfigError(f"max_bytes must be positive or None, not {max_bytes}")
        self.max_bytes = max_bytes
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
            c.evictions, len(self._flights),
        )  # fmt: skip

    def entry_files(self, url: str) -> EntryFiles:
        return EntryFiles.of(self.root, url)

    # -- fetch -------------------------------------------------------------------------

    async def fetch(
        self,
        url: str | Sequence[str],
        *,
        limits: Limits | None = None,
        concurrency: int | None = None,
        chunk_size: int | str | None = None,
        http: HttpOptions | None = None,
        headers: Mapping[str, str] | None = None,
        s3: S3Options | None = None,
        progress: Progress | None = None,
    ) -> CachedModel:
        """Make every file of the model at ``url`` complete in the cache.

        Args:
            url: an ``http(s)://`` or ``s3://`` model, as ``load_model`` takes it (an
                index, an S3 prefix, a file, or a list of file URLs).
            limits, concurrency, chunk_size, http, headers, s3: as for ``Loader``;
                ``concurrency`` ranges of ``chunk_size`` bytes are downloaded at once.
            progress: called as ``progress(bytes_done, bytes_total)`` as bytes arrive.

        Returns:
            The CachedModel, with a local ``path`` that ``load_model`` reads directly.

        Raises:
            CacheError: the cache folder is full or not writable.
            SourceError: the remote model could not be read (a partial download stays
                in the cache and the next fetch resumes it).
        """
        urls = (url,) if isinstance(url, str) else tuple(url)
        flight = self._flights.get(urls)
        if flight is None or flight.task.done():
            options = _Options.of(limits, concurrency, chunk_size, http, headers, s3)
            task = asyncio.get_running_loop().create_task(
                self._fetch(url if isinstance(url, str) else list(urls), options, progress),
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

    async def _fetch(
        self, url: str | list[str], options: _Options, progress: Progress | None
    ) -> CachedModel:
        urls = [url] if isinstance(url, str) else url
        if not urls:
            raise ConfigError("an empty list of URLs was given; pass at least one file")
        for u in urls:
            if scheme_of(u) not in REMOTE_SCHEMES:
                raise ConfigError(
                    f"{u} is not remote; the cache holds http(s):// and s3:// files only "
                    "(load local files directly)"
                )
        limits = options.limits
        source = source_for(
            urls[0], concurrency=limits.concurrency, http=options.http, s3=options.s3
        )
        executor = ThreadPoolExecutor(limits.concurrency, thread_name_prefix="aioloader-cache")
        try:
            layout = await resolve_layout(source, url)
            wanted = ([layout.index] if layout.index else []) + list(layout.files)
            fetcher = _Fetcher(self, source, executor, limits, _Meter(progress))
            results = await fetcher.run(wanted)
            exclude = {key_of(u) for u in wanted}
            try:
                model_path = await run_blocking(
                    executor, lambda: self._link_model(url, layout, source)
                )
            except OSError as exc:
                raise cache_error(exc, self.root, f"linking the files of {urls[0]}") from exc
            await self._evict(exclude)
        finally:
            await source.aclose()
            # Every call into the pool has returned (run_blocking waits): joins at once.
            executor.shutdown(wait=True)
        downloaded = sum(d for _, d in results.values())
        return CachedModel(
            url=url if isinstance(url, str) else urls[0],
            path=model_path,
            files={u: str(self.entry_files(u).data) for u in wanted},
            bytes=sum(size for size, _ in results.values()),
            hit=downloaded == 0,
            downloaded=downloaded,
            _entries=tuple(self.entry_files(u) for u in wanted),
        )

    def _link_model(
        self, url: str | list[str], layout: ModelLayout, source: Source
    ) -> str | list[str]:
        """A folder under ``<root>/models/`` that mirrors the model with symlinks."""
        key = key_of(url if isinstance(url, str) else "\n".join(url))
        folder = self.root / "models" / key
        folder.mkdir(parents=True, exist_ok=True)

        def link(remote: str, name: str) -> str:
            target = self.entry_files(remote).data
            path = folder / name
            temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            for attempt in range(3):
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.symlink(target, temp)
                    break
                except FileNotFoundError:
                    # Another process pruned the folder as empty between the two calls.
                    if attempt == 2:
                        raise
            os.replace(temp, path)
            return str(path)

        if layout.index is not None:
            base = source.parent(layout.index).rstrip("/") + "/"
            for remote in layout.files:
                inside = remote.startswith(base)
                link(remote, unquote(remote[len(base) :]) if inside else _basename(remote))
            return link(layout.index, _basename(layout.index))
        if not isinstance(url, str):
            names: list[str] = []
            for i, remote in enumerate(layout.files):
                name = _basename(remote)
                names.append(link(remote, name if name not in names else f"{i}-{name}"))
            return names
        paths = [link(remote, _basename(remote)) for remote in layout.files]
        return paths[0] if layout.files == (url,) else str(folder)

    # -- entries, removal, eviction ----------------------------------------------------

    def entries(self) -> list[CacheEntry]:
        """Every entry on disk, complete or partial, least recently used first.

        Reads the cache folder (blocking I/O: from async code, call it in a thread).
        """
        out = []
        folder = self.root / "entries"
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return []
        for name in names:
            files = EntryFiles(self.root, folder / name)
            meta = read_meta(files)
            if meta is None:
                continue
            entry = CacheEntry(
                url=meta.url, size=meta.size, complete=meta.complete,
                last_used=meta.last_used, bytes_on_disk=files.bytes_on_disk(),
                etag=meta.etag, path=str(files.dir),
            )  # fmt: skip
            out.append(entry)
        out.sort(key=lambda e: e.last_used)
        return out

    async def remove(self, url: str) -> bool:
        """Delete the entry of the file at ``url``; waits for a download of it to end.

        Returns:
            Whether there was an entry.

        Raises:
            CacheError: a load is reading the entry right now.
        """
        files = self.entry_files(url)
        if not await asyncio.to_thread(files.dir.is_dir):
            return False
        lock = await acquire(files.lock, exclusive=True)
        try:
            use = await asyncio.to_thread(try_acquire, files.use, exclusive=True)
            if use is None:
                raise CacheError(
                    f"model cache {self.root}: {url} is being read by a load; remove it "
                    "once the load has finished"
                )
            try:
                existed = await asyncio.to_thread(files.meta.exists)
                await asyncio.to_thread(files.discard)
            finally:
                use.release()
            if existed:
                await asyncio.to_thread(self._prune_models)
        except OSError as exc:
            raise cache_error(exc, self.root, f"removing {url}") from exc
        finally:
            lock.release()
        return existed

    async def _evict(self, exclude: set[str]) -> None:
        if self.max_bytes is None:
            return
        try:
            evicted = await asyncio.to_thread(self._evict_sync, self.max_bytes, exclude)
        except OSError as exc:
            raise cache_error(exc, self.root, "evicting old entries") from exc
        self._counters.evictions += evicted

    def _evict_sync(self, max_bytes: int, exclude: set[str]) -> int:
        """Delete LRU complete entries until the cache fits; skip any that is locked."""
        entries = self.entries()
        total = sum(e.bytes_on_disk for e in entries)
        evicted = 0
        for entry in entries:
            if total <= max_bytes:
                break
            files = EntryFiles(self.root, Path(entry.path))
            if not entry.complete or files.dir.name in exclude:
                continue
            lock = try_acquire(files.lock, exclusive=True)
            if lock is None:
                continue
            try:
                use = try_acquire(files.use, exclusive=True)
                if use is None:
                    continue  # being read right now
                try:
                    files.discard()
                finally:
                    use.release()
            finally:
                lock.release()
            logger.info("model cache %s: evicted %s (%d bytes)", self.root, entry.url, entry.size)
            total -= entry.bytes_on_disk
            evicted += 1
        if evicted:
            self._prune_models()
        if total > max_bytes:
            logger.warning(
                "model cache %s holds %d bytes, above max_bytes=%d: the rest is in use",
                self.root, total, max_bytes,
            )  # fmt: skip
        return evicted

    def _prune_models(self) -> None:
        """Delete the links under ``<root>/models/`` to evicted or removed entries.

        A model folder left with no links goes too. A later fetch of that model
        links its files again.
        """
        models = self.root / "models"
        for folder, dirs, files in os.walk(models, topdown=False):
            for name in files + dirs:
                path = os.path.join(folder, name)
                if os.path.islink(path) and not os.path.exists(path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            if folder != str(models):
                with contextlib.suppress(OSError):  # not empty: it still links to entries
                    os.rmdir(folder)

    async def _after_complete(self, url: str) -> None:
        """Bookkeeping once a load through the cache completed an entry."""
        await self._evict({key_of(url)})

    def _count_download(self, nbytes: int) -> None:
        self._counters.bytes_downloaded += nbytes

    def _count(self, *, hit: bool, downloaded: int = 0) -> None:
        if hit:
            self._counters.hits += 1
        else:
            self._counters.misses += 1
        self._counters.bytes_downloaded += downloaded
