"""HTTP(S): concurrent ``Range`` GETs through one shared transport.

Each byte range is one GET. A failed transfer (reset, short body, 5xx, stall) is
retried with exponential backoff and jitter, resuming from the last byte that
arrived; ``429`` / ``503`` also lower the requests in flight (see retry.py and
throttle.py). The version seen when a file is opened is pinned (see blob.py). The
configured headers go only to the URL's own origin (see signer.py).
"""

from __future__ import annotations

from urllib.parse import quote, urljoin

from ...runtime.threads import Lanes
from ...runtime.throttle import LimiterStatistics
from ...settings.values import HttpOptions
from ..base import Blob, Current, Source
from .signer import HeaderSigner
from .store import HttpStore

__all__ = ["HttpSource"]


class HttpSource(Source):
    """Files served over HTTP(S).

    Args:
        lanes: the owner's threads; ``lanes.concurrency`` requests in flight at most.
        options: retries, timeouts and extra headers.
    """

    scheme_name = "HTTP"

    def __init__(self, lanes: Lanes, options: HttpOptions | None = None) -> None:
        options = options or HttpOptions()
        self._store = HttpStore(type(self).__name__, lanes, options, HeaderSigner(options.headers))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._store!r}>"

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    async def list_dir(self, url: str) -> list[str] | None:
        # An HTTP server cannot be asked for a folder listing: a URL ending in "/" is
        # read as a model folder by its usual file names (see resolve_layout).
        return None

    async def open(self, url: str) -> Blob:
        return await self._store.open(url, url)

    async def current(self, url: str) -> Current:
        """From a HEAD (no body); opened where the server cannot answer one usefully."""
        found = await self._store.head(url, url)
        return Current(*found) if found is not None else await super().current(url)

    def join(self, base: str, name: str) -> str:
        # A name is a file's name (an index's shard, a listing's entry), never a URL:
        # percent-encoded, so that "#", "?", "%" or ":" in it stay part of the path.
        return urljoin(base if base.endswith("/") else base + "/", quote(name))

    async def aclose(self) -> None:
        await self._store.aclose()
