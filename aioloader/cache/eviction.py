"""Keeping the cache under its cap: the cap on disk, the entries, eviction (sync).

The cap belongs to the cache folder, not to one process: ``ModelCache(root,
max_bytes=N)`` records N in ``<root>/cache.json``, and every process that uses
the folder without a cap of its own (a pod's ``Loader(cache_dir=...)``) holds
it too. Eviction takes the least recently used entries first, partial ones
included, and never one that a process is downloading (its ``lock``) or reading
(its ``use``). ``Eviction`` is one ModelCache's cap and the evictions it makes:
before an entry is written (``make_room``), after a load completes one
(``after_complete``) and after a fetch (``after_fetch``).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Executor
from pathlib import Path

from ..redact import redact, redacting_logger
from ..runtime.threads import run_blocking
from .entry import EntryFiles, cache_error, key_of, read_meta, replace_file
from .links import prune_models
from .locks import try_acquire
from .paths import check_dirs, open_file
from .records import CacheEntry

__all__ = ["Eviction", "evict", "list_entries", "read_cap", "write_cap"]

logger = redacting_logger(__name__)

CAP_FILE = "cache.json"


def read_cap(root: Path) -> int | None:
    """The cap recorded in the cache folder, or None."""
    try:
        fd = open_file(root / CAP_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with open(fd, "rb") as fh:
        try:
            cap = json.loads(fh.read()).get("max_bytes")
        except (ValueError, AttributeError):
            return None
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0 else None


def write_cap(root: Path, max_bytes: int) -> None:
    """Record ``max_bytes`` as the cap of every process that uses the folder."""
    if read_cap(root) == max_bytes:
        return
    root.mkdir(parents=True, exist_ok=True)
    replace_file(root / CAP_FILE, json.dumps({"max_bytes": max_bytes}).encode())


def list_entries(root: Path) -> list[CacheEntry]:
    """Every entry on disk, complete or partial, least recently used first.

    Raises:
        CacheError: ``<root>/entries`` is a symbolic link.
    """
    folder = root / "entries"
    if not check_dirs(root, folder):
        return []
    out = []
    with os.scandir(folder) as listing:
        dirs = sorted(d.name for d in listing if d.is_dir(follow_symlinks=False))
    for name in dirs:
        files = EntryFiles(root, folder / name)
        meta = read_meta(files)
        if meta is None:
            continue
        entry = CacheEntry(
            url=redact(meta.url), size=meta.size, complete=meta.complete,
            last_used=meta.last_used, bytes_on_disk=files.bytes_on_disk(),
            etag=meta.etag, path=str(files.dir),
        )  # fmt: skip
        out.append(entry)
    out.sort(key=lambda e: e.last_used)
    return out


def _discard_unused(files: EntryFiles) -> bool:
    """Delete the entry's bytes unless a process downloads or reads it now."""
    lock = try_acquire(files.lock, exclusive=True)
    if lock is None:
        return False  # being downloaded
    try:
        use = try_acquire(files.use, exclusive=True)
        if use is None:
            return False  # being read
        try:
            files.discard()
        finally:
            use.release()
    finally:
        lock.release()
    return True


def evict(root: Path, max_bytes: int, exclude: set[str], reserve: int = 0) -> int:
    """Delete least recently used entries until the cache, plus ``reserve`` bytes, fits.

    Args:
        exclude: entry folder names to keep whatever their age (the caller's own).
        reserve: bytes about to be written.

    Returns:
        How many entries were deleted.
    """
    entries = list_entries(root)
    total = sum(e.bytes_on_disk for e in entries) + reserve
    evicted = 0
    for entry in entries:
        if total <= max_bytes:
            break
        files = EntryFiles(root, Path(entry.path))
        if files.dir.name in exclude or not _discard_unused(files):
            continue
        state = "" if entry.complete else "partial "
        logger.info("model cache %s: evicted %s%s (%d bytes)", root, state, entry.url, entry.size)
        total -= entry.bytes_on_disk
        evicted += 1
    if evicted:
        prune_models(root)
    if total > max_bytes:
        logger.warning(
            "model cache %s needs %d bytes, above max_bytes=%d: the rest is in use",
            root, total, max_bytes,
        )  # fmt: skip
    return evicted


class Eviction:
    """The cap of one ModelCache and the evictions that keep its folder under it.

    Args:
        root: the cache folder.
        max_bytes: this object's cap, recorded in the folder on first use; ``None``:
            the folder's recorded cap, if any.
    """

    def __init__(self, root: Path, max_bytes: int | None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.evictions = 0  # entries this object deleted
        self._cap_recorded = False

    def cap(self) -> int | None:
        """This object's cap (recorded in the folder once), else the folder's (sync)."""
        if self.max_bytes is None:
            return read_cap(self.root)
        if not self._cap_recorded:
            try:
                write_cap(self.root, self.max_bytes)
            except OSError as exc:
                logger.debug("model cache %s: cannot record max_bytes: %s", self.root, exc)
            self._cap_recorded = True
        return self.max_bytes

    def evict(self, exclude: set[str], reserve: int = 0) -> None:
        """Evict least recently used entries but ``exclude`` until ``reserve`` more bytes
        fit under the cap (blocking).

        Raises:
            CacheError: deleting an entry failed.
        """
        cap = self.cap()
        if cap is None:
            return
        try:
            self.evictions += evict(self.root, cap, exclude, reserve)
        except OSError as exc:
            raise cache_error(exc, self.root, "evicting old entries") from exc

    async def make_room(
        self, files: EntryFiles, size: int, exclude: set[str], lane: Executor
    ) -> None:
        """Evict old entries so that the ``size`` bytes of ``files`` fit under the cap
        (in ``lane``, the caller's ``cache`` lane)."""
        reserve = max(0, size - await run_blocking(lane, files.bytes_on_disk))
        await run_blocking(lane, lambda: self.evict(exclude | {files.dir.name}, reserve))

    def after_complete(self, url: str) -> None:
        """Evict what a load that completed ``url``'s entry put above the cap (blocking:
        called from a commit thread).

        Raises:
            CacheError: evicting older entries failed.
        """
        self.evict({key_of(url)})

    async def after_fetch(self, exclude: set[str], lane: Executor) -> None:
        """Evict what a fetch of the entries ``exclude`` put above the cap (in ``lane``)."""
        await run_blocking(lane, lambda: self.evict(exclude))
