"""What a load reads a URL through: the stores' sources with the caches around them.

On top of ``Stores`` (sources/stores.py: one Source per store, ``locate``), a load
reads:

* through the node cache (``CachingSource``) when a cache is configured and the
  scheme is remote, else for ``hf://`` through the Hugging Face cache writes
  (``HfCacheWrites``) unless ``hf_cache=False``;
* for one ``hf://`` URL (not a stream, not with ``group=``), warm from the hub
  cache's commit while the Hub is asked (sources/hf/warm_start.py).

The stack owns every source it built and closes them in ``aclose``. The node cache
and the Hub's modules are imported only when a cache is configured or an
``hf://`` URL is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..runtime.threads import Lanes
from ..settings.options import LoadOptions
from ..sources.base import Source
from ..sources.stores import URL, Location, Stores, locate

if TYPE_CHECKING:
    from ..cache import ModelCache
    from ..sources.hf.url import HfLocation

__all__ = ["URL", "Location", "SourceStack", "locate"]

T = TypeVar("T")


def _cache_of(cache_dir: Any) -> ModelCache | None:
    """``False`` (or ``None``, once options are built) means no cache at all."""
    if cache_dir is False or cache_dir is None:
        return None
    from ..cache import ModelCache

    return cache_dir if isinstance(cache_dir, ModelCache) else ModelCache(cache_dir)


class SourceStack(Stores):
    """The sources of one owner's loads, with the caches a load reads through.

    Args:
        options: the settings (http, s3, cache_dir, hf_cache, the hf:// revision check).
        lanes: as for ``Stores``.
        staged: the reads land in buffers reused at once (a device that copies): each
            cache write happens as its read arrives, not after the load.
    """

    def __init__(
        self, options: LoadOptions, lanes: Lanes | None = None, *, staged: bool = False
    ) -> None:
        super().__init__(options, lanes)
        self.staged = staged
        self.cache = _cache_of(options.cache_dir)

    def __repr__(self) -> str:
        return f"<SourceStack {sorted(self._sources)} cache={self.cache!r}>"

    def load_source(self, where: Location) -> Source:
        """What a load of ``where`` reads through: the store's Source inside the node
        cache or the Hugging Face cache writes, as configured (see the module)."""
        source = self.source(where)
        if where.scheme.name == "hf" and self.cache is None:
            return self._hf_cache_writes(where) if self.options.hf_cache else source
        if self.cache is None or not where.scheme.remote:
            return source
        key = f"{where.store}+cache"
        caching = self._sources.get(key)
        if caching is None:
            from ..cache import CachingSource

            # Host tensors are the buffers reads land in: their cache writes can wait
            # until the load is over. Staged (GPU) buffers are reused at once.
            caching = self._sources[key] = CachingSource(
                source, self.cache, lanes=self.lanes, write_after=not self.staged
            )
        return caching

    async def load(self, where: Location, attempt: Callable[[Location], Awaitable[T]]) -> T:
        """``await attempt(where)``: a whole load, which for one ``hf://`` URL without
        ``group=`` may start from the hub cache's commit and be taken back when the
        Hub names another (sources/hf/warm_start.py)."""
        if where.hf is None or self.options.group is not None:
            return await attempt(where)
        from ..sources.hf.warm_start import load_warm

        def at(hf: HfLocation) -> Awaitable[T]:
            return attempt(where if hf is where.hf else where.on_hub(hf))

        return await load_warm(self.hub(where), where.hf, at)

    def _hf_cache_writes(self, where: Location) -> Source:
        key = f"{where.store}+hf-cache"
        writes = self._sources.get(key)
        if writes is None:
            from ..sinks.hf.cache_writes import HfCacheWrites

            # Host tensors stay as they were read until the write after the load; a
            # staged (GPU) load reuses its buffers at once: each read is written first.
            through = self.lanes.cache if self.staged else None
            writes = self._sources[key] = HfCacheWrites(
                self.hub(where), through=through, lane=self.lanes.cache
            )
        return writes
