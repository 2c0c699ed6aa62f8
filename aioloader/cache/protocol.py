"""What loads and fetches need from the cache they fill: ``CacheProtocol``.

``ModelCache`` implements it. Fetches (fetch.py) and loads through the cache
(caching_source.py) depend on this protocol, not on model_cache.py, so
``ModelCache`` can build both without an import cycle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .entry import EntryFiles
from .eviction import Eviction

__all__ = ["CacheProtocol"]


class CacheProtocol(Protocol):
    """A node cache, as the code that writes its entries sees it."""

    @property
    def root(self) -> Path:
        """The cache folder."""

    @property
    def check_etag(self) -> bool:
        """Whether a download is checked against an ETag that looks like an MD5."""

    @property
    def lock_stall(self) -> float:
        """Seconds a wait for an entry's lock tolerates a holder without progress."""

    def entry_files(self, url: str) -> EntryFiles:
        """The files of ``url``'s entry."""

    @property
    def eviction(self) -> Eviction:
        """The cap, and the evictions before and after entries are written."""

    def warn_uncached(self, exc: OSError, url: str) -> None:
        """Say (once) that this cache cannot take files, and why."""

    def record(self, *, hit: bool, downloaded: int = 0) -> None:
        """Count a hit, or a miss and the bytes it downloaded."""

    def record_download(self, nbytes: int) -> None:
        """Count bytes downloaded into an entry."""
