"""S3-compatible object storage: signed range GETs through the HTTP transport.

The source holds an HttpStore (http/store.py) whose transport signs every request
with an S3Signer (signer.py); here are S3's own parts: listing a prefix, and the
checksums an object was uploaded with, which every read of a whole object is
checked against (digests.py, verifying.py): of the whole object, or of each of its
parts (a multipart upload's COMPOSITE checksum; checksums.py says which), whose sizes
a ``HEAD ?partNumber=N`` gives. Object and bucket URLs, path-style or virtual-hosted,
are built in url.py.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import cast
from urllib.parse import quote, urlencode

from ...errors import NotFoundError, SourceError
from ...redact import redacting_logger
from ...runtime.threads import Lanes
from ...runtime.throttle import LimiterStatistics
from ...settings.values import HttpOptions, S3Options
from ..base import Blob, Current, Source
from ..digests import Digest
from ..http.listing import broken_listing, listed, prefix_to_list, xml_listing
from ..http.retry import RetryableError
from ..http.store import HttpStore
from ..http.transport import transport_errors
from ..verifying import open_beside, verifying
from .checksums import guess_parts, read_checksum, whole_only
from .signer import S3_NAMESPACE, S3Signer, xml_text
from .url import bucket_url, object_url, split_s3_url

__all__ = ["S3Source"]

logger = redacting_logger(__name__)

# What a HEAD of an object or of a part says about its checksums and its parts.
_HEAD_NAMES = (
    "x-amz-checksum-", "x-amz-server-side-encryption", "x-amz-mp-parts-count", "etag",
    "content-length",
)  # fmt: skip


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
        """The checksum of the object's bytes it was uploaded with (a HEAD in checksum
        mode: ranged GETs never carry it), and its ``x-amz-server-side-encryption*``
        headers, which say whether its ETag can be an MD5 (not under SSE-KMS or SSE-C).
        A composite checksum of a multipart upload, or one whose kind the store leaves
        open, is not a digest of the bytes and is left out (checksums.py)."""
        return whole_only(await self._head(url))

    async def _head(self, url: str, part: int = 0) -> dict[str, str]:
        """The headers of a HEAD in checksum mode of the object, or of its ``part``."""
        await self._signer.setup()
        fetch_url = self._object_url(url) + (f"?partNumber={part}" if part else "")
        return await self._store.retrier.run(url, 0, 0, partial(self._head_once, url, fetch_url))

    async def _head_once(self, url: str, fetch_url: str) -> dict[str, str]:
        transport = self._store.transport
        headers = {"x-amz-checksum-mode": "ENABLED"}
        try:
            async with await transport.send("HEAD", url, fetch_url, headers) as response:
                await transport.check_status(url, response, None)
                return {
                    name.lower(): value
                    for name, value in response.headers.items()
                    if name.lower().startswith(_HEAD_NAMES)
                }
        except transport_errors() as exc:
            raise RetryableError(str(exc) or type(exc).__name__) from exc

    async def _digest(self, url: str) -> Digest | None:
        """What to check ``url``'s bytes against: its checksum, of the whole object or of
        its parts (their sizes asked with ``HEAD ?partNumber=N``); None where there is
        none this process can compute, or it cannot be used (said at WARNING)."""
        headers = await self._head(url)
        found = read_checksum(headers)
        if found is None:
            return None
        where = f"S3 publishes ({found.header})"
        if found.problem is None and found.kind == "whole":
            return Digest(found.algorithm, found.value, "base64", where)
        size = _length(headers)
        problem = found.problem
        if problem is None:
            parts, problem = await self._parts(url, size, found.parts)
        if problem is not None or not parts:
            logger.warning(
                "%s: read unchecked: its %s cannot be checked (%s)", url, found.header, problem
            )
            return None
        composite = "composite " if found.kind == "composite" else ""
        where = f"S3 publishes ({found.header}, {composite}over its {len(parts)} parts)"
        return Digest(
            found.algorithm, found.value, "base64", where, parts=parts,
            whole_too=found.kind == "either", confirm=partial(self._confirm, url, size, parts),
        )  # fmt: skip

    async def _parts(self, url: str, size: int, count: int) -> tuple[tuple[int, ...], str | None]:
        """The sizes of the object's ``count`` parts, from the first one's when they are
        all of its size but the last (an SDK's uploads: checked again on a mismatch, see
        ``_confirm``), else from every part's; or why they cannot be known."""
        try:
            first = await self._head(url, 1)
        except SourceError as exc:
            return (), f"its first part could not be asked for: {exc}"
        said = first.get("x-amz-mp-parts-count", "").strip()
        if said and said != str(count):
            return (), f"its parts say they are {said}, not {count}"
        guess = guess_parts(size, _length(first), count)
        if guess is not None:
            return guess, None
        return await self._every_part(url, size, count)

    async def _every_part(
        self, url: str, size: int, count: int
    ) -> tuple[tuple[int, ...], str | None]:
        failed: SourceError | None = None
        try:
            async with asyncio.TaskGroup() as group:
                heads = [group.create_task(self._head(url, n)) for n in range(1, count + 1)]
        except* SourceError as errors:
            failed = cast(SourceError, errors.exceptions[0])
        if failed is not None:
            return (), f"its parts could not be asked for: {failed}"
        parts = tuple(_length(head.result()) for head in heads)
        if sum(parts) != size:
            return (), f"its {count} parts hold {sum(parts)} bytes, not {size}"
        if count > 1 and min(parts) < 1:
            return (), f"its part {parts.index(min(parts)) + 1} is empty"
        return parts, None

    async def _confirm(self, url: str, size: int, parts: tuple[int, ...]) -> bool:
        """Whether the object's parts are ``parts``: asked of each before a mismatch is
        told, as the sizes may have been guessed from the first part's."""
        found, problem = await self._every_part(url, size, len(parts))
        if found != parts:
            logger.warning(
                "%s: read unchecked: its parts are not of the sizes the first one suggested "
                "(%s)", url, problem or "they differ",
            )  # fmt: skip
        return found == parts

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

    async def current(self, url: str) -> Current:
        """From a HEAD (no body); opened where the store cannot answer one usefully."""
        await self._signer.setup()
        found = await self._store.head(url, self._object_url(url))
        return Current(*found) if found is not None else await super().current(url)

    async def open(self, url: str) -> Blob:
        """Open ``url``, checked against its full-object checksum when it has one: asked
        with a HEAD beside the first read (ranged GETs never carry it), see verifying.py."""
        await self._signer.setup()
        try:
            blob, digest = await open_beside(
                self._store.open(url, self._object_url(url)), self._digest(url)
            )
        except NotFoundError as exc:
            raise NotFoundError(
                f"{url} does not exist at {self._signer.endpoint} ({exc}); check the bucket and key"
            ) from exc
        if digest is not None and digest.parts and sum(digest.parts) != blob.size:
            digest = None  # replaced between the HEAD and the read: the read says so
        return verifying(blob, digest, self._lanes.digest)

    async def aclose(self) -> None:
        await self._store.aclose()


def _length(headers: dict[str, str]) -> int:
    """A HEAD's Content-Length; -1 where it gives none that is a number."""
    value = headers.get("content-length", "").strip()
    return int(value) if value.isascii() and value.isdigit() else -1
