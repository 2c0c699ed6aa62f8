"""A file read from the Hub, written into the hub cache after the load has returned.

The hub cache's sink (sink.py) keeps the ranges a load read: views of the caller's
tensors (a load into host memory) and the header bytes. When the blob closes, a
commit thread (sinks/commits.py, shared with the node cache) runs ``write_blob``: only a file
read whole is written, chunk by chunk, each chunk copied once and hashed as the
very bytes that go to disk, into a temporary name in ``blobs/``. The digest is
checked against the blob's id before the rename: the LFS sha256 the Hub publishes
for a weight file, the git blob sha1 of a regular one. A corrupted download, and a
tensor the caller changed in place before it was written, both fail that check,
and the blob is dropped with a warning: the published digest is the one witness
that covers both, so no digest is taken on arrival (the load pays no hashing).
Hashing the copy that is written, not the caller's memory, leaves no window for a
change between the check and the write.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...redact import redacting_logger
from ...sources.hf.hf_cache import HfCache, sweep_temporaries, temporary_name
from ...sources.hf.snapshot import Snapshot

__all__ = [
    "CHUNK",
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


def write_blob(cache: HfCache, blob_id: str, size: int, ranges: Ranges) -> bool:
    """Write the file ``ranges`` cover into ``blobs/<blob_id>``; False (with a warning)
    when its bytes are not ``blob_id``'s. Blocking: a commit thread runs it."""
    if committed(cache, blob_id, size):
        return True
    final = cache.blob(blob_id)
    views = _in_order(ranges, size)
    if views is None:
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(final)
    temporary = temporary_name(final)
    digest = blob_digest(blob_id, size)
    copy = memoryview(bytearray(CHUNK))
    try:
        with open(temporary, "wb") as out:
            for view in views:
                for start in range(0, view.nbytes, CHUNK):
                    piece = view[start : start + CHUNK]
                    chunk = copy[: piece.nbytes]
                    chunk[:] = piece  # the one copy: hashed and written, not the caller's bytes
                    digest.update(chunk)
                    out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        return publish(cache, blob_id, temporary, digest.hexdigest(), _CHANGED)
    finally:
        temporary.unlink(missing_ok=True)


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
