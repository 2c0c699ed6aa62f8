"""What a URL is read through: the source stack, built from a load's settings.

``locate`` parses a URL (or a list of file URLs) once into a ``Location``: its
scheme's row (sources/schemes.py), its store and, for one ``hf://`` URL, its place
on the Hub; that is what travels on to the sources. ``SourceStack`` keeps, per
store (``store_of``: an Azure account's SAS or token must not reach another
host), what reads it:

* the store's Source (sources/auto.py);
* around it, for a load, the node cache (``CachingSource``) when a cache is
  configured and the scheme is remote, else for ``hf://`` the Hugging Face cache
  writes (``HfCacheWrites``) unless ``hf_cache=False``;
* an ``hf://`` load (not a stream, not with ``group=``) starts warm from the hub
  cache's commit while the Hub is asked (sources/hf/warm_start.py).

The stack owns every source it built and closes them in ``aclose``, then its
lanes when it made them. The node cache and the Hub's modules are imported only
when a cache is configured or an ``hf://`` URL is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .errors import ConfigError
from .options import LoadOptions
from .sources.auto import scheme_of, source_for, store_of, unsupported
from .sources.base import Source
from .sources.schemes import Scheme, scheme_named
from .threads import Lanes

if TYPE_CHECKING:
    from .cache import ModelCache
    from .sources.hf.source import HfSource
    from .sources.hf.url import HfLocation

__all__ = ["URL", "Location", "SourceStack", "locate"]

URL = str | Sequence[str]
T = TypeVar("T")


@dataclass(frozen=True)
class Location:
    """A load's URL, parsed once.

    Attributes:
        url: as given: one URL, or a tuple of file URLs of one store.
        scheme: the first URL's scheme's row.
        store: the store its Source is kept under (``store_of``).
        hf: the place on the Hub of a single ``hf://`` URL; None otherwise.
    """

    url: str | tuple[str, ...]
    scheme: Scheme
    store: str
    hf: HfLocation | None = None

    @property
    def first(self) -> str:
        """The URL, or the first of the list."""
        return self.url if isinstance(self.url, str) else self.url[0]

    def on_hub(self, hf: HfLocation) -> Location:
        """The same load at another place on the Hub (a revision pinned to its commit)."""
        return replace(self, url=hf.url(), hf=hf)


def locate(url: URL) -> Location:
    """Parse ``url`` (see ``Location``).

    Raises:
        ConfigError: an empty list, URLs of different stores, a scheme no backend
            reads, or a malformed URL (an ``hf://`` one names the part that is wrong).
    """
    urls = (url,) if isinstance(url, str) else tuple(url)
    if not urls:
        raise ConfigError("an empty list of URLs was given; pass at least one file")
    stores = {store_of(u) for u in urls}
    if len(stores) > 1:
        raise ConfigError(
            f"the URLs are in different stores ({', '.join(sorted(stores))}); load them separately"
        )
    row = scheme_named(scheme_of(urls[0]))
    if row is None:
        raise unsupported(urls[0])
    hf = None
    if row.name == "hf" and isinstance(url, str):
        from .sources.hf.url import parse_hf_url

        hf = parse_hf_url(url)
    return Location(url if isinstance(url, str) else urls, row, stores.pop(), hf)


def _cache_of(cache_dir: Any) -> ModelCache | None:
    """``False`` (or ``None``, once options are built) means no cache at all."""
    if cache_dir is False or cache_dir is None:
        return None
    from .cache import ModelCache

    return cache_dir if isinstance(cache_dir, ModelCache) else ModelCache(cache_dir)


class SourceStack:
    """The sources of one owner's loads (a Loader, a fetch, a folder copy).

    Args:
        options: the settings (http, s3, cache_dir, hf_cache, the hf:// revision check).
        lanes: the owner's threads, closed by the owner; None: the stack makes its own
            (``options.limits.concurrency``) and closes them in ``aclose``.
        staged: the reads land in buffers reused at once (a device that copies): each
            cache write happens as its read arrives, not after the load.

    Use as ``async with SourceStack(options) as stack:``, or call ``aclose``.
    """

    def __init__(
        self, options: LoadOptions, lanes: Lanes | None = None, *, staged: bool = False
    ) -> None:
        self.options = options
        self._owns_lanes = lanes is None
        if lanes is None:
            limits = options.limits
            assert limits is not None
            lanes = Lanes(limits.concurrency)
        self.lanes = lanes
        self.staged = staged
        self.cache = _cache_of(options.cache_dir)
        self._sources: dict[str, Source] = {}

    def __repr__(self) -> str:
        return f"<SourceStack {sorted(self._sources)} cache={self.cache!r}>"

    @property
    def opened(self) -> bool:
        """Whether any source was built (and so needs ``aclose``)."""
        return bool(self._sources)

    def source(self, where: Location) -> Source:
        """The Source of ``where``'s store, built on first use: what headers and
        listings are read through (an inspection, a fetch, a folder copy)."""
        source = self._sources.get(where.store)
        if source is None:
            check = self._hf_check() if where.scheme.name == "hf" else None
            source = self._sources[where.store] = source_for(
                where.first,
                lanes=self.lanes,
                http=self.options.http,
                s3=self.options.s3,
                hf_check=check,
            )
        return source

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
            from .cache import CachingSource

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
        from .sources.hf.warm_start import load_warm

        def at(hf: HfLocation) -> Awaitable[T]:
            return attempt(where if hf is where.hf else where.on_hub(hf))

        return await load_warm(self._hub(where), where.hf, at)

    def _hub(self, where: Location) -> HfSource:
        # The table's hf row builds an HfSource (sources/schemes.py).
        return cast("HfSource", self.source(where))

    def _hf_check(self) -> Any:
        from .sources.hf.revision import RevisionCheck

        return RevisionCheck(self.options.hf_revision_timeout, self.options.hf_fresh)

    def _hf_cache_writes(self, where: Location) -> Source:
        key = f"{where.store}+hf-cache"
        writes = self._sources.get(key)
        if writes is None:
            from .sources.hf.cache_writes import HfCacheWrites

            # Host tensors stay as they were read until the write after the load; a
            # staged (GPU) load reuses its buffers at once: each read is written first.
            through = self.lanes.cache if self.staged else None
            writes = self._sources[key] = HfCacheWrites(self._hub(where), through=through)
        return writes

    def statistics(self) -> dict[str, Any]:
        """Each store's request statistics (remote stores), keyed by store."""
        found = {}
        for store, source in self._sources.items():
            stats = source.statistics()
            if stats is not None:
                found[store] = stats
        return found

    async def __aenter__(self) -> SourceStack:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every source built, then the lanes if the stack made them; idempotent."""
        sources, self._sources = list(self._sources.values()), {}
        try:
            for source in sources:
                await source.aclose()
        finally:
            if self._owns_lanes:
                # Every call into them has returned (run_blocking waits): joins at once.
                self.lanes.close()
