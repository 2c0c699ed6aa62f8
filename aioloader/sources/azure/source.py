"""Azure Blob Storage: ``az://container/path`` and ``https://<account>.blob.core.windows.net/...``.

Range GETs through the HTTP transport, pinned to the blob's ETag (``If-Match``),
and container listing by prefix. The account and its endpoint come from the URL
(``https://<account>.blob.core.windows.net/``), else from the environment
(settings.py); the credentials are the signer's (signer.py).

A blob read whole is checked against the MD5 Azure keeps for it (``Content-MD5``,
asked with a HEAD beside the first read), where it keeps one: the service computes it
for a blob written by one Put Blob; one written in blocks (an SDK's upload above its
single-put size) has none unless the client set one, and is read as it is.

A source serves one account (a Loader keeps one per account: ``store_of`` in
auto.py), and the SAS or key of the environment goes only to the account it names.
"""

from __future__ import annotations

from functools import partial
from urllib.parse import quote, urlencode, urlparse

from ...errors import NotFoundError, SourceError
from ...redact import redact
from ...runtime.threads import Lanes
from ...runtime.throttle import LimiterStatistics
from ...settings.values import HttpOptions
from ..base import Blob, Source
from ..digests import Digest
from ..http.listing import broken_listing, listed, prefix_to_list, xml_listing
from ..http.retry import RetryableError
from ..http.store import HttpStore
from ..http.transport import transport_errors
from ..verifying import open_beside, verifying
from .signer import AzureSigner
from .url import AzureBlobAddress, with_query

__all__ = ["AzureSource"]


class AzureSource(Source):
    """Blobs in Azure Blob Storage or Azurite (see the module docstring).

    Args:
        lanes: the owner's threads; ``lanes.concurrency`` requests in flight at most.
        http: retries and timeouts.
    """

    scheme_name = "Azure Blob Storage"

    def __init__(self, lanes: Lanes, http: HttpOptions | None = None) -> None:
        self._lanes = lanes
        self._signer = AzureSigner(lanes.setup)
        self._store = HttpStore(type(self).__name__, lanes, http or HttpOptions(), self._signer)

    def __repr__(self) -> str:
        return f"<AzureSource {self._signer.described}>"

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    async def list_dir(self, url: str) -> list[str] | None:
        where = AzureBlobAddress(url)
        await self._signer.setup(where)
        prefix = prefix_to_list(where.name)
        if prefix is None:
            return None
        names: list[str] = []
        marker = ""
        while True:
            params = {"restype": "container", "comp": "list", "prefix": prefix, "delimiter": "/"}
            if marker:
                params["marker"] = marker
            query = urlencode(params, quote_via=quote)
            fetch_url = with_query(where.container_url, query, await self._signer.query(where))
            body = await self._store.read_body(
                url,
                fetch_url,
                lambda detail: (
                    f"{redact(url)}: {detail or 'not found'}; check the container "
                    f"{where.container!r} of account {where.account!r} at {where.endpoint}"
                ),
            )
            root = xml_listing(url, where.endpoint, body, "EnumerationResults")
            for blob in root.iter("Blob"):
                name = blob.findtext("Name")
                if not name:
                    raise broken_listing(url, where.endpoint, "a <Blob> has no <Name>")
                if name.startswith(prefix) and name != prefix:
                    names.append(name[len(prefix) :])
            for folder in root.iter("BlobPrefix"):  # a sub-folder: "<prefix>sub/"
                name = folder.findtext("Name") or ""
                if name.startswith(prefix) and name != prefix:
                    names.append(name[len(prefix) :])
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return listed(names, where.name)

    async def open(self, url: str) -> Blob:
        where = AzureBlobAddress(url)
        await self._signer.setup(where)
        if not where.name:
            raise SourceError(f"{redact(url)} names a container, not a blob or a prefix/")
        fetch_url = with_query(where.blob_url(), await self._signer.query(where))
        try:
            blob, md5 = await open_beside(
                self._store.open(url, fetch_url), self._content_md5(url, fetch_url)
            )
        except NotFoundError as exc:
            raise NotFoundError(
                f"{redact(url)} does not exist in container {where.container!r} of "
                f"account {where.account!r} ({exc}); check the container and blob name"
            ) from exc
        digest = (
            Digest("md5", md5, "base64", "Azure keeps for the blob (Content-MD5)") if md5 else None
        )
        return verifying(blob, digest, self._lanes.digest)

    async def _content_md5(self, url: str, fetch_url: str) -> str | None:
        """The blob's Content-MD5 (a HEAD: Get Blob Properties); None where it has none."""
        return await self._store.retrier.run(url, 0, 0, partial(self._head_once, url, fetch_url))

    async def _head_once(self, url: str, fetch_url: str) -> str | None:
        transport = self._store.transport
        try:
            async with await transport.send("HEAD", url, fetch_url, {}) as response:
                await transport.check_status(url, response, None)
                return response.headers.get("Content-MD5", "").strip() or None
        except transport_errors() as exc:
            raise RetryableError(str(exc) or type(exc).__name__) from exc

    def join(self, base: str, name: str) -> str:
        if base.startswith("az://"):  # no query, and "#" is part of a name
            return super().join(base, name)
        parsed = urlparse(base)
        path = parsed.path.rstrip("/") + "/" + name
        return parsed._replace(path=path).geturl()

    def parent(self, url: str) -> str:
        if url.startswith("az://"):
            return super().parent(url)
        parsed = urlparse(url)
        return parsed._replace(path=parsed.path.rsplit("/", 1)[0]).geturl()

    async def aclose(self) -> None:
        await self._store.aclose()
