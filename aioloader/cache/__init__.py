"""A node-local cache of remote model files, shared by the processes of a machine.

``ModelCache(root).fetch(url)`` downloads a model's files into ``root`` once;
``Loader(cache_dir=root)`` loads remote models through it, reading complete and
still-current files from disk and filling the cache while it streams the rest.
See model_cache.py (the cache), fetch.py (downloads), entry.py (one entry on disk),
partial.py (one download in progress), locks.py, claim.py, records.py (what it
reports), caching_source.py (loading through it), sink.py with write_after.py (a
load's bytes into its entry: the cache's sink, sinks/), commit.py (completing
entries after a load), protocol.py (what the writers need of the
cache), links.py (a fetched model's folder of links), paths.py (nothing is written
outside the cache folder), checksum.py and verify.py (checksums of entries),
removal.py, eviction.py (the size cap and eviction), and supply.py (where a fetch's
files come from other than their origin: the swarm's one seam into the cache).
"""

from __future__ import annotations

from .caching_source import CachingSource
from .model_cache import ModelCache
from .records import CachedModel, CacheEntry, CacheStatistics, VerifyResult

__all__ = [
    "CacheEntry",
    "CacheStatistics",
    "CachedModel",
    "CachingSource",
    "ModelCache",
    "VerifyResult",
]
