"""S3-compatible object storage: signed range GETs through the HTTP transport.

The source holds an HttpStore (http/store.py) whose transport signs every request
with an S3Signer (signer.py); here are S3's own parts: listing a prefix, and the
checksums an object was uploaded with, which every read of a whole object is
checked against (digests.py, verifying.py). Object and bucket URLs, path-style or
virtual-hosted, are built in url.py.
"""

from __future__ import annotations

import asyncio
from functools import partial
from urllib.parse import quote, urlencode

from ...config import HttpOptions, S3Options
from ...errors import NotFoundError
from ...threads import Lanes
from ...throttle import LimiterStatistics
from ..base import Blob, Source
from ..digests import s3_digest
from ..http.listing import broken_listing, listed, prefix_to_list, xml_listing
from ..http.retry import RetryableError
from ..http.store import HttpStore
from ..http.transport import transport_errors
from ..verifying import verifying
from .signer import S3_NAMESPACE, S3Signer, xml_text
from .url import bucket_url, object_url, split_s3_url

__all__ = ["S3Source"]


class S3Source(Source):
    """Objects in S3 or an S3-compatible store (MinIO, Ceph RGW, ...).

    Args:
        lanes: the owner's threads; ``lanes.concurrency`` requests in flight at most.
        http: retries, timeouts (and headers, unused for S3).
        options: endpoint, region, addressing style, anonymous access, profile.
    """

    scheme_name = "S3"
    etag_is_md5 = True  # for single-part uploads, but not under SSE-KMS or SSE-C

    def __init__(
        self, lanes: Lanes, http: HttpOptions | None = None, options: S3Options | None = None
    ) -> None:
        self._lanes = lanes
        self._signer = S3Signer(options or S3Options(), lanes.setup)
        self._store = HttpStore(type(self).__name__, lanes, http or HttpOptions(), self._signer)

    def __repr__(self) -> str:
        signer = self._signer
        return (
            f"<S3Source endpoint={signer.endpoint or '(unresolved)'} region={signer.region} "
            f"path_style={signer.path_style}>"
        )

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    # -- URLs ----------------------------------------------------------------------

    def _bucket_url(self, bucket: str) -> str:
        return bucket_url(self._signer.endpoint, bucket, path_style=self._signer.path_style)

    def _object_url(self, url: str) -> str:
        return object_url(self._signer.endpoint, url, path_style=self._signer.path_style)

    # -- checksums -----------------------------------------------------------------

    async def object_checksums(self, url: str) -> dict[str, str]:
        """The ``x-amz-checksum-*`` of an object uploaded with one (a HEAD in checksum
        mode: ranged GETs never carry it), and its ``x-amz-server-side-encryption*``
        headers, which say whether its ETag can be an MD5 (not under SSE-KMS or SSE-C).
        Composite checksums of multipart uploads (``<digest>-<parts>``) are not digests
        of the bytes and are left out; ``x-amz-checksum-type`` is kept."""
        await self._signer.setup()
        fetch_url = self._object_url(url)
        return await self._store.retrier.run(
            url, 0, 0, partial(self._head_checksums, url, fetch_url)
        )

    async def _head_checksums(self, url: str, fetch_url: str) -> dict[str, str]:
        transport = self._store.transport
        headers = {"x-amz-checksum-mode": "ENABLED"}
        try:
            async with await transport.send("HEAD", url, fetch_url, headers) as response:
                await transport.check_status(url, response, None)
                found = {}
                for name, value in response.headers.items():
                    name = name.lower()
                    if name.startswith("x-amz-server-side-encryption") or (
                        name.startswith("x-amz-checksum-")
                        and (name == "x-amz-checksum-type" or "-" not in value)
                    ):
                        found[name] = value
                return found
        except transport_errors() as exc:
            raise RetryableError(str(exc) or type(exc).__name__) from exc

    # -- listing -------------------------------------------------------------------

    async def list_dir(self, url: str) -> list[str] | None:
        await self._signer.setup()
        bucket, key = split_s3_url(url)
        prefix = prefix_to_list(key)
        if prefix is None:
            return None
        return listed(await self._list(url, bucket, prefix), key)

    async def _list(self, url: str, bucket: str, prefix: str) -> list[str]:
        names: list[str] = []
        token: str | None = None
        while True:
            params = {"list-type": "2", "prefix": prefix, "delimiter": "/"}
            if token:
                params["continuation-token"] = token
            query = urlencode(sorted(params.items()), quote_via=quote, safe="~")
            fetch_url = f"{self._bucket_url(bucket)}/?{query}"
            body = await self._store.read_body(
                url,
                fetch_url,
                lambda detail: (
                    f"{url}: {detail or 'not found'}; check the bucket name {bucket!r} and "
                    f"the endpoint {self._signer.endpoint}"
                ),
            )
            root = xml_listing(url, self._signer.endpoint, body, "ListBucketResult")
            for item in [*root.iter(S3_NAMESPACE + "Contents"), *root.iter("Contents")]:
                name = xml_text(item, "Key")
                if not name:
                    raise broken_listing(url, self._signer.endpoint, "a <Contents> has no <Key>")
                if name.startswith(prefix) and name != prefix:
                    names.append(name[len(prefix) :])
            for item in [*root.iter(S3_NAMESPACE + "CommonPrefixes"), *root.iter("CommonPrefixes")]:
                folder = xml_text(item, "Prefix") or ""  # a sub-folder: "<prefix>sub/"
                if folder.startswith(prefix) and folder != prefix:
                    names.append(folder[len(prefix) :])
            truncated = (xml_text(root, "IsTruncated") or "false").lower() == "true"
            token = xml_text(root, "NextContinuationToken")
            if not truncated or not token:
                return sorted(names)

    # -- Source --------------------------------------------------------------------

    async def open(self, url: str) -> Blob:
        """Open ``url``, checked against its full-object checksum when it has one: asked
        with a HEAD beside the first read (ranged GETs never carry it), see verifying.py."""
        await self._signer.setup()
        head = asyncio.ensure_future(self.object_checksums(url))
        try:
            blob = await self._store.open(url, self._object_url(url))
        except BaseException as exc:
            head.cancel()
            await asyncio.wait([head])
            if head.done() and not head.cancelled():
                head.exception()  # the open's error is the one to tell
            if isinstance(exc, NotFoundError):
                raise NotFoundError(
                    f"{url} does not exist at {self._signer.endpoint} ({exc}); check the "
                    "bucket and key"
                ) from exc
            raise
        try:
            checksums = await head
        except BaseException:
            await blob.aclose()
            raise
        return verifying(blob, s3_digest(checksums), self._lanes.digest)

    async def aclose(self) -> None:
        await self._store.aclose()
