"""Keeping the cache under its cap: the cap on disk, the entries, eviction (sync).

The cap belongs to the cache folder, not to one process: ``ModelCache(root,
max_bytes=N)`` records N in ``<root>/cache.json``, and every process that uses
the folder without a cap of its own (a pod's ``Loader(cache_dir=...)``) holds
it too. Eviction takes the least recently used entries first, partial ones
included, and never one that a process is downloading (its ``lock``) or reading
(its ``use``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from pathlib import Path

from ..redact import redact
from .entry import EntryFiles, read_meta
from .locks import try_acquire
from .paths import check_dirs, open_file
from .records import CacheEntry

__all__ = ["evict", "list_entries", "prune_models", "read_cap", "write_cap"]

logger = logging.getLogger("aioloader")

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
    temp = root / f".{CAP_FILE}.{secrets.token_hex(4)}.tmp"
    try:
        fd = open_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, "wb") as fh:
            fh.write(json.dumps({"max_bytes": max_bytes}).encode())
        os.replace(temp, root / CAP_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


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


def prune_models(root: Path) -> None:
    """Delete the links under ``<root>/models/`` to evicted or removed entries.

    A model folder left with no links goes too. A later fetch of that model
    links its files again.
    """
    models = root / "models"
    if not check_dirs(root, models):
        return
    for folder, dirs, files in os.walk(models, topdown=False):
        for name in files + dirs:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not os.path.exists(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if folder != str(models):
            with contextlib.suppress(OSError):  # not empty: it still links to entries
                os.rmdir(folder)
