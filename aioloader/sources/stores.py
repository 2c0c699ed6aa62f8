"""The stores a URL list is read from, and one Source per store.

``locate`` parses a URL (or a list of file URLs) once into a ``Location``: its
scheme's row (schemes.py), its store and, for one ``hf://`` URL, its place on the
Hub; that is what travels on, from the edge (the API, the CLI, the daemon's POST,
the integrations) down to the Source. A check judges that value too: the daemon's
allow-list reads its place on the Hub, or its normalised ``parts`` (url_parts.py),
worked out once and carried on it. ``Stores`` keeps one Source per store
(``store_of``: an Azure account's SAS or token must not reach another host), built
on first use from the settings, hands an ``hf://`` location's place to its source
(which then reads it rather than parse the URL again), and closes them, then its
lanes when it made them.

This is what reads a store as it is (a fetch, a folder copy, an inspection); the
caches a load reads through are layered on top by aioloader/load/stack.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from ..errors import ConfigError
from ..runtime.resource import AsyncResource
from ..runtime.threads import Lanes
from ..settings.options import LoadOptions
from .auto import backend_of, scheme_of, source_for, store_of, unsupported
from .base import Source
from .schemes import Scheme, scheme_named
from .url_parts import UrlParts, url_parts

if TYPE_CHECKING:
    from .hf.source import HfSource
    from .hf.url import HfLocation

__all__ = ["URL", "Location", "Stores", "locate"]

URL = str | Sequence[str]


@dataclass(frozen=True)
class Location:
    """A load's URL, parsed once.

    Attributes:
        url: as given: one URL, or a tuple of file URLs of one store.
        scheme: the first URL's scheme's row.
        store: the store its Source is kept under (``store_of``).
        hf: the place on the Hub of a single ``hf://`` URL; None otherwise.
        backend: the row of the backend that reads it (an Azure account's https URLs
            are Azure's); None: found when its Source is built.
    """

    url: str | tuple[str, ...]
    scheme: Scheme
    store: str
    hf: HfLocation | None = None
    backend: Scheme | None = None

    @property
    def first(self) -> str:
        """The URL, or the first of the list."""
        return self.url if isinstance(self.url, str) else self.url[0]

    def on_hub(self, hf: HfLocation) -> Location:
        """The same load at another place on the Hub (a revision pinned to its commit)."""
        return replace(self, url=hf.url(), hf=hf)

    @classmethod
    def of_hub(cls, hf: HfLocation) -> Location:
        """The location of a place on the Hub, parsed already (no URL read again)."""
        row = scheme_named("hf")
        assert row is not None
        return cls(hf.url(), row, "hf", hf, row)

    @cached_property
    def parts(self) -> UrlParts:
        """The first URL's scheme, host, port and path segments, normalised for
        comparison (url_parts.py); worked out on first use, then kept.

        Raises:
            UnsafeUrlError: the URL's meaning may change after a check (user info, dot
                segments, encoded separators, control characters, backslashes).
        """
        return url_parts(self.first)


def locate(url: URL) -> Location:
    """Parse ``url`` (see ``Location``).

    Raises:
        ConfigError: an empty list, URLs of different stores, a scheme no backend
            reads, or a malformed URL (an ``hf://`` one names the part that is wrong).
    """
    urls = (url,) if isinstance(url, str) else tuple(url)
    if not urls:
        raise ConfigError("an empty list of URLs was given; pass at least one file")
    schemes = [scheme_of(u) for u in urls]  # each URL's scheme read once
    stores = {store_of(u, scheme) for u, scheme in zip(urls, schemes, strict=True)}
    if len(stores) > 1:
        raise ConfigError(
            f"the URLs are in different stores ({', '.join(sorted(stores))}); load them separately"
        )
    row = scheme_named(schemes[0])
    backend = backend_of(urls[0], schemes[0])
    if row is None or backend is None:
        raise unsupported(urls[0])
    hf = None
    if row.name == "hf" and isinstance(url, str):
        from .hf.url import parse_hf_url

        hf = parse_hf_url(url)
    where = url if isinstance(url, str) else urls
    return Location(where, row, stores.pop(), hf, backend)


class Stores(AsyncResource):
    """One Source per store, for one owner (a Loader, a fetch, a folder copy).

    Args:
        options: the settings (http, s3, the hf:// revision check).
        lanes: the owner's threads, closed by the owner; None: made here
            (``options.limits.concurrency``) and closed in ``aclose``.

    Use as ``async with Stores(options) as stores:``, or call ``aclose``.
    """

    def __init__(self, options: LoadOptions, lanes: Lanes | None = None) -> None:
        self.options = options
        self._owns_lanes = lanes is None
        if lanes is None:
            limits = options.limits
            assert limits is not None
            lanes = Lanes(limits.concurrency)
        self.lanes = lanes
        self._sources: dict[str, Source] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {sorted(self._sources)}>"

    @property
    def opened(self) -> bool:
        """Whether any source was built (and so needs ``aclose``)."""
        return bool(self._sources)

    def source(self, where: Location) -> Source:
        """The Source of ``where``'s store, built on first use."""
        source = self._sources.get(where.store)
        if source is None:
            check = self._hf_check() if where.scheme.name == "hf" else None
            source = self._sources[where.store] = source_for(
                where.first,
                lanes=self.lanes,
                http=self.options.http,
                s3=self.options.s3,
                hf_check=check,
                backend=where.backend,
            )
        if where.hf is not None:  # its reads of where.first take this place, parsed once
            cast("HfSource", source).know(where.first, where.hf)
        return source

    def hub(self, where: Location) -> HfSource:
        """The Source of an ``hf://`` location (the table's hf row builds an HfSource)."""
        return cast("HfSource", self.source(where))

    def _hf_check(self) -> Any:
        from .hf.revision import RevisionCheck

        return RevisionCheck(self.options.hf_revision_timeout, self.options.hf_fresh)

    def statistics(self) -> dict[str, Any]:
        """Each store's request statistics (remote stores), keyed by store."""
        found = {}
        for store, source in self._sources.items():
            stats = source.statistics()
            if stats is not None:
                found[store] = stats
        return found

    async def aclose(self) -> None:
        """Close every source built, then the lanes if made here; idempotent."""
        sources, self._sources = list(self._sources.values()), {}
        try:
            for source in sources:
                await source.aclose()
        finally:
            if self._owns_lanes:
                # Every call into them has returned (run_blocking waits): joins at once.
                self.lanes.close()
