"""Where a weight file read from the Hub goes in the hub cache, and how it gets there.

``WeightFile`` names the blob and the snapshot's link; ``publish`` renames a file
written whole and synced into ``blobs/<id>`` when its digest is the blob's id: the
LFS sha256 the Hub publishes for a weight file, the git blob sha1 of a regular one
(``blob_digest``); a mismatch leaves it for its writer to remove, with a warning.
The temporary file itself is written as the load reads (blob_through.py).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...redact import redacting_logger
from ...sources.hf.hf_cache import HfCache
from ...sources.hf.snapshot import Snapshot

__all__ = [
    "CHUNK",
    "WeightFile",
    "blob_digest",
    "committed",
    "publish",
]

logger = redacting_logger(__name__)

CHUNK = 1 << 20


def blob_digest(blob_id: str, size: int) -> Any:
    """A hash that ends as ``blob_id`` for the right bytes: sha256 (LFS) or git's sha1."""
    if len(blob_id) == 64:
        return hashlib.sha256()
    git = hashlib.sha1(usedforsecurity=False)
    git.update(b"blob %d\0" % size)
    return git


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
