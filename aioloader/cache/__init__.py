"""A node-local cache of remote model files, shared by the processes of a machine.

``ModelCache(root).fetch(url)`` downloads a model's files into ``root`` once;
``Loader(cache_dir=root)`` loads remote models through it, reading complete and
still-current files from disk and filling the cache while it streams the rest.
See store.py (the cache), fetch.py (downloads), entry.py (one entry on disk),
locks.py, ranges.py, info.py (what it reports), tee.py (loading through it),
links.py (a fetched model's folder of links), paths.py (nothing is written outside
the cache folder), checksum.py and verify.py (checksums of entries), and space.py
(the size cap and eviction).
"""

from __future__ import annotations

from .info import CachedModel, CacheEntry, CacheStatistics, VerifyResult
from .store import ModelCache
from .tee import CachingSource

__all__ = [
    "CacheEntry",
    "CacheStatistics",
    "CachedModel",
    "CachingSource",
    "ModelCache",
    "VerifyResult",
]
