"""A file read from the Hub, written into the hub cache after the load has returned.

The hub cache's sink (sink.py) keeps the ranges a load read: views of the caller's
tensors (a load into host memory) and the header bytes, each with an xxh3 digest of
its bytes taken as it arrived (in a thread). When the blob closes, a commit thread
(sinks/commits.py, shared with the node cache) runs ``write_blob``: only a file read
whole is written, chunk by chunk, each chunk copied once, into a temporary name in
``blobs/`` (with ``O_DIRECT`` where the file system allows, as the node cache writes),
and its digest is checked against the blob's id before the rename: the LFS sha256 the
Hub publishes for a weight file, the git blob sha1 of a regular one.

Where the load checked that digest itself as the bytes arrived (``Blob.checked``,
sources/verifying.py), the blob is not hashed a second time: each range's copy is
checked against its arrival digest instead (xxh3, some 20 times cheaper than SHA-256),
so the file written holds the bytes the load checked. A tensor the caller changed in
place before it was written fails that check, and the blob is dropped with a warning.
Where two ranges overlap (the header's probe and the first tensors) and their bytes
differ, or the load did not check the file, the copy that is written is hashed as it
is written, the published digest being the one witness then. Hashing or checking the
copy, not the caller's memory, leaves no window for a change between check and write.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from ...redact import redacting_logger
from ...runtime.direct_io import DIRECT_IO, write_at
from ...sources.hf.hf_cache import HfCache, sweep_temporaries, temporary_name
from ...sources.hf.snapshot import Snapshot

__all__ = [
    "CHUNK",
    "Kept",
    "Ranges",
    "WeightFile",
    "blob_digest",
    "committed",
    "publish",
    "write_blob",
]

logger = redacting_logger(__name__)

CHUNK = 1 << 20
_CHANGED = "a corrupted download, or a tensor changed in place before it was written"

Ranges = list[tuple[int, memoryview]]
Kept = tuple[int, Sequence[memoryview], str]  # offset, views, xxh3 digest on arrival


def blob_digest(blob_id: str, size: int) -> Any:
    """A hash that ends as ``blob_id`` for the right bytes: sha256 (LFS) or git's sha1."""
    if len(blob_id) == 64:
        return hashlib.sha256()
    git = hashlib.sha1(usedforsecurity=False)
    git.update(b"blob %d\0" % size)
    return git


def _in_order(ranges: Ranges, size: int) -> list[memoryview] | None:
    """Views covering ``[0, size)`` back to back, taken from ``ranges`` (which may
    overlap), or None when some byte was never read."""
    out, at = [], 0
    for offset, view in sorted(ranges, key=lambda r: r[0]):
        if offset > at:
            return None
        end = offset + view.nbytes
        if end > at:
            out.append(view[at - offset :])
            at = end
    return out if at >= size else None


def write_blob(cache: HfCache, blob_id: str, size: int, kept: list[Kept], checked: bool) -> bool:
    """Write the file the ``kept`` ranges cover into ``blobs/<blob_id>``; False (with a
    warning) when its bytes are not ``blob_id``'s. ``checked``: the load checked the
    bytes it read against ``blob_id`` (see the module). Blocking: a commit thread runs it."""
    if committed(cache, blob_id, size):
        return True
    kept = sorted(kept, key=lambda k: k[0])
    flat = [(o, v) for offset, views, _ in kept for o, v in _placed(offset, views)]
    views = _in_order(flat, size)
    if views is None:
        return False
    final = cache.blob(blob_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(final)
    temporary = temporary_name(final)
    try:
        with open(temporary, "w+b", buffering=0) as out:  # read back where ranges overlap
            file = _File(out.fileno(), _open_direct(temporary))
            try:
                if checked:
                    found = _write_known(file, kept, blob_id, size)
                else:
                    found = _write_hashed(file, views, blob_id, size)
            finally:
                file.close()
            os.fsync(out.fileno())
        return publish(cache, blob_id, temporary, found, _CHANGED)
    finally:
        temporary.unlink(missing_ok=True)


def _open_direct(path: Path) -> int | None:
    """A second descriptor of ``path`` for ``O_DIRECT`` writes; None where the file system
    refuses (tmpfs) or the platform has none."""
    if not DIRECT_IO:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return None


class _File:
    """The temporary blob: page-aligned chunks go with ``O_DIRECT`` straight to the disk
    (no page cache to fill, nothing left for ``fsync`` to write back: on our VMs 0.2 s per
    512 MiB against 0.4-0.9 s buffered), the rest buffered; reads go through ``fd``."""

    def __init__(self, fd: int, direct: int | None) -> None:
        self.fd = fd
        self.direct = direct

    def write(self, data: memoryview, at: int) -> None:
        write_at(self.fd, self.direct, data, at)

    def close(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None


def _chunk_buffer() -> memoryview:
    """A page-aligned buffer of ``CHUNK`` bytes, as ``O_DIRECT`` asks."""
    return memoryview(mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))


def _placed(offset: int, views: Sequence[memoryview]) -> list[tuple[int, memoryview]]:
    out = []
    for view in views:
        out.append((offset, view))
        offset += view.nbytes
    return out


def _write_hashed(file: _File, views: list[memoryview], blob_id: str, size: int) -> str:
    """Write ``views`` back to back, hashing the copy written; its digest."""
    digest = blob_digest(blob_id, size)
    copy = _chunk_buffer()
    at = 0
    for view in views:
        for start in range(0, view.nbytes, CHUNK):
            piece = view[start : start + CHUNK]
            chunk = copy[: piece.nbytes]
            chunk[:] = piece  # the one copy: hashed and written, not the caller's bytes
            digest.update(chunk)
            file.write(chunk, at)
            at += chunk.nbytes
    return str(digest.hexdigest())


def _write_known(file: _File, kept: list[Kept], blob_id: str, size: int) -> str:
    """Write the ``kept`` ranges (in offset order, no gap), each range's copy checked
    against its arrival digest: ``blob_id`` when every one matches (the load checked
    those bytes), the digest of the file as written when two overlapping ranges
    differ, ``""`` (no blob's) when a range changed since it arrived."""
    copy = _chunk_buffer()
    fd = file.fd
    at = 0  # bytes written
    differ = False
    for offset, views, digest in kept:
        check = xxhash.xxh3_64()
        position = offset
        for view in views:
            view = view.cast("B") if view.format != "B" else view
            for start in range(0, view.nbytes, CHUNK):
                piece = view[start : start + CHUNK]
                chunk = copy[: piece.nbytes]
                chunk[:] = piece
                check.update(chunk)
                end = position + chunk.nbytes
                skip = min(max(0, at - position), chunk.nbytes)
                if skip and not differ:  # bytes written already, from another range
                    differ = os.pread(fd, skip, position) != chunk[:skip]
                if end > at:
                    file.write(chunk[skip:], position + skip)
                    at = end
                position = end
        if check.hexdigest() != digest:
            return ""
    return _hashed(fd, blob_id, size) if differ else blob_id


def _hashed(fd: int, blob_id: str, size: int) -> str:
    """The digest of the file as written, read from disk."""
    digest = blob_digest(blob_id, size)
    for start in range(0, size, CHUNK):
        digest.update(os.pread(fd, min(CHUNK, size - start), start))
    return str(digest.hexdigest())


def committed(cache: HfCache, blob_id: str, size: int) -> bool:
    """Whether ``blobs/<blob_id>`` is there whole (written by us, another process or
    huggingface_hub): nothing to write then."""
    final = cache.blob(blob_id)
    return final.is_file() and final.stat().st_size == size


def publish(cache: HfCache, blob_id: str, temporary: Path, digest: str, suspects: str) -> bool:
    """Rename ``temporary`` (written whole and synced) to ``blobs/<blob_id>`` when
    ``digest``, taken of its bytes, is ``blob_id``; else warn, naming the ``suspects``,
    and leave it for the caller to remove."""
    if digest != blob_id:
        logger.warning(
            "Hugging Face cache %s: the bytes read for blob %s of %s do not match the "
            "digest the Hub publishes (%s); not caching it",
            cache.root,
            blob_id,
            cache.repo_id,
            suspects,
        )
        return False
    os.replace(temporary, cache.blob(blob_id))
    return True


@dataclass(frozen=True)
class WeightFile:
    """Where a weight file read from the Hub goes in the hub cache.

    Attributes:
        cache: the repository's folder in the hub cache.
        snapshot: the commit the file was read at.
        path: its path in the repository.
        size: its size in bytes.
        blob_id: the LFS sha256 the Hub publishes for it.
    """

    cache: HfCache
    snapshot: Snapshot
    path: str
    size: int
    blob_id: str

    def warn(self, exc: OSError) -> None:
        """Say that the cache could not take this file."""
        logger.warning(
            "Hugging Face cache %s: %s of %s was not cached: %s",
            self.cache.root,
            self.path,
            self.snapshot.describe(),
            exc,
        )

    def settle(self, write: Callable[[], bool]) -> None:
        """Run ``write`` (True: it committed the blob) and link the snapshot's file to
        the blob: a commit thread's job, so it logs its errors."""
        try:
            if write():
                self.cache.link(self.snapshot.sha, self.path, self.blob_id)
        except OSError as exc:
            self.warn(exc)
