"""model-cache's tools: loads through the node-local cache, and the untimed fill."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ..scenarios import CACHE_FILL, CACHE_TOOLS
from .base import (
    Loaded,
    Prepared,
    event_loop_runner,
    import_for_load,
    stream_all,
    tensor_bytes,
)
from .remote import RemoteJob


def _cache_load(job: RemoteJob, cache_dir: Path | None) -> Prepared:
    """``load_model(index URL, cache_dir=...)``: through the cache in ``cache_dir``, or none."""
    import aioloader

    import_for_load(job.target)
    importlib.import_module("aioloader.cache.caching_source")

    run = event_loop_runner()
    cache = aioloader.ModelCache(cache_dir) if cache_dir is not None else None
    # False: not $AIOLOADER_CACHE_DIR either
    through: aioloader.ModelCache | Literal[False] = cache if cache is not None else False

    def load() -> Loaded:
        tensors: dict[str, Any] = {}
        first = run(stream_all(job.target, cache_dir=through, into=tensors))
        return Loaded(tensors, tensor_bytes(tensors), cache=cache_counters(cache), first=first)

    return load


def _cache_fill(job: RemoteJob, cache_dir: Path | None) -> Prepared:
    """``ModelCache(cache_dir).fetch(index URL)``: every file of the model into the cache."""
    import aioloader

    if cache_dir is None:
        raise RuntimeError(f"{CACHE_FILL} needs a cache folder (--cache-dir)")
    import_for_load(job.target)
    run = event_loop_runner()
    cache = aioloader.ModelCache(cache_dir)

    def load() -> Loaded:
        cached = run(cache.fetch(job.target))
        return Loaded(cached, cached.bytes, cache=cache_counters(cache))

    return load


def warm_up_folder(cache_dir: Path) -> Path:
    """The cache folder of populate's warm-up load (``--reuse-memory``), beside its own."""
    return cache_dir.with_name(cache_dir.name + "-warm-up")


def wait_committed(folder: Path) -> None:
    """Wait until the entries that loads wrote into ``folder`` are committed."""
    import aioloader

    event_loop_runner()(aioloader.ModelCache(folder).wait_committed())


def cache_counters(cache: Any) -> dict[str, int] | None:
    """What a ModelCache counted: hits and misses (files), bytes downloaded."""
    if cache is None:
        return None
    stats = cache.statistics()
    return {"hits": stats.hits, "misses": stats.misses, "downloaded": stats.bytes_downloaded}


CACHE_PREPARE: dict[str, Callable[[RemoteJob, Path | None], Prepared]] = {
    **dict.fromkeys(CACHE_TOOLS, _cache_load),
    CACHE_FILL: _cache_fill,
}
