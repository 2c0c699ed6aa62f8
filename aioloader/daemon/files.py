"""``GET /v1/models/{id}/files/{key}``: a cached file, with what vouches for its bytes.

``aioloader fetch --daemon`` copies the files the daemon holds instead of reading the
origin; it must be able to tell that the bytes it gets are the file it asked for, of
the version the origin has now. The answer carries, besides ``Content-Length``:

- ``X-Aioloader-Checksum``: the ``xxh3-128:<hex>`` the cache entry recorded when its
  download completed (cache/checksum.py): bytes changed on disk since, or on the way,
  hash otherwise;
- ``X-Aioloader-Etag``: the origin's ETag the entry was downloaded at (absent where the
  origin gave none): a copy of another version than the client opened is not used.

Neither is a secret. The client checks both, and the publisher's digest where the
origin gives one (fetch/daemon_client.py, fetch/copy.py).
"""

from __future__ import annotations

from aiohttp import web

from ..cache import ModelCache

__all__ = ["CHECKSUM_HEADER", "ETAG_HEADER", "file_answer"]

CHECKSUM_HEADER = "X-Aioloader-Checksum"
ETAG_HEADER = "X-Aioloader-Etag"


async def file_answer(cache: ModelCache, url: str) -> web.FileResponse:
    """The entry's bytes of ``url`` and its record in headers (a 404 once evicted)."""
    meta = await cache.recorded(url)
    headers = {}
    if meta is not None and meta.checksum:
        headers[CHECKSUM_HEADER] = meta.checksum
    if meta is not None and meta.etag and meta.etag.isascii() and meta.etag.isprintable():
        headers[ETAG_HEADER] = meta.etag
    return web.FileResponse(cache.entry_files(url).data, headers=headers)
