"""S3-compatible object storage: signed range GETs on the HTTP machinery.

Credentials, region and profiles come from botocore's standard chain
(environment, shared config and credentials files, web identity, instance
metadata), never from a chain of our own. Each range GET is signed with AWS
Signature V4 by botocore, with credentials frozen and refreshed off the event
loop, so signing stays a small fixed cost per multi-megabyte request.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
import time
import xml.etree.ElementTree as ET
from functools import partial
from typing import Any
from urllib.parse import quote, urlencode, urlparse

from ..config import HttpOptions, S3Options
from ..errors import ConfigError, NotFoundError, SourceError
from .http import HttpSource

__all__ = ["S3Source", "split_s3_url"]

# Credentials are re-read (off the loop) at least this often, so refreshable
# ones (web identity, instance roles) never go stale mid-load.
_CREDENTIAL_TTL = 60.0
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ConfigError(f"{url} is not an S3 URL; write s3://bucket/key")
    return parsed.netloc, parsed.path.lstrip("/")


def _mask(key: str | None) -> str:
    if not key:
        return "none"
    return key[:4] + "..." + key[-4:] if len(key) > 8 else "****"


def _is_ip_address(url: str) -> bool:
    try:
        ipaddress.ip_address(urlparse(url).hostname or "")
    except ValueError:
        return False
    return True


def _xml_text(element: ET.Element, tag: str) -> str | None:
    found = element.find(_NS + tag)
    if found is None:
        found = element.find(tag)
    return found.text if found is not None else None


class S3Source(HttpSource):
    """Objects in S3 or an S3-compatible store (MinIO, Ceph RGW, ...).

    Args:
        concurrency: the most requests in flight.
        http: retries, timeouts (and headers, unused for S3).
        options: endpoint, region, addressing style, anonymous access, profile.
    """

    scheme_name = "S3"

    def __init__(
        self, concurrency: int, http: HttpOptions | None = None, options: S3Options | None = None
    ) -> None:
        super().__init__(concurrency, http)
        self._s3 = options or S3Options()
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._session_info: dict[str, Any] = {}
        self._botocore_credentials: Any = None
        self._frozen: Any = None
        self._frozen_at = 0.0
        self._endpoint = ""
        self._region = "us-east-1"
        self._path_style = True
        self._ca_bundle: str | None = None

    def __repr__(self) -> str:
        return (
            f"<S3Source endpoint={self._endpoint or '(unresolved)'} region={self._region} "
            f"path_style={self._path_style}>"
        )

    # -- configuration, resolved once and off the loop --------------------------------

    async def _setup(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if not self._ready:
                await asyncio.to_thread(self._resolve)
                self._ready = True

    def _resolve(self) -> None:
        try:
            import botocore.session
        except ImportError as exc:  # pragma: no cover - declared dependency
            raise ConfigError("reading s3:// URLs needs botocore: pip install botocore") from exc
        options = self._s3
        session = botocore.session.Session(profile=options.profile)
        endpoint = (
            options.endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        region = options.region or session.get_config_variable("region") or "us-east-1"
        addressing = os.environ.get("AIOLOADER_S3_ADDRESSING") or options.addressing
        if addressing not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"AIOLOADER_S3_ADDRESSING must be 'path', 'virtual' or 'auto', got {addressing!r}"
            )
        self._path_style = addressing == "path" or (addressing == "auto" and endpoint is not None)
        self._endpoint = (endpoint or f"https://s3.{region}.amazonaws.com").rstrip("/")
        if not self._path_style and _is_ip_address(self._endpoint):
            # bucket.10.0.0.5 resolves nowhere: every request would fail on DNS, retried
            # until attempts run out, with a message that hides the cause.
            raise ConfigError(
                f"virtual-hosted S3 addressing puts the bucket in the host name, which the "
                f"endpoint {self._endpoint} (an IP address) cannot have; use path-style "
                "addressing: AIOLOADER_S3_ADDRESSING=path or S3Options(addressing='path')"
            )
        self._region = region
        self._ca_bundle = os.environ.get("AWS_CA_BUNDLE") or session.get_config_variable(
            "ca_bundle"
        )
        credentials = None if options.anonymous else session.get_credentials()
        self._botocore_credentials = credentials
        self._frozen = credentials.get_frozen_credentials() if credentials else None
        self._frozen_at = time.monotonic()
        self._session_info = {
            "credentials": "anonymous (unsigned requests)"
            if credentials is None
            else f"{getattr(credentials, 'method', 'unknown')} (access key "
            f"{_mask(self._frozen.access_key)})",
            "profile": options.profile or os.environ.get("AWS_PROFILE") or "default",
        }

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self._ca_bundle:
            return ssl.create_default_context(cafile=self._ca_bundle)
        return None

    async def _client(self) -> Any:
        await self._setup()
        return await super()._client()

    def _follow_redirects(self) -> bool:
        return False  # a redirect would carry a signature made for another host

    def _target(self, fetch_url: str) -> Any:
        from yarl import URL

        # Keys are percent-encoded exactly as signed: aiohttp must not re-encode them.
        return URL(fetch_url, encoded=True)

    # -- URLs ----------------------------------------------------------------------

    def _bucket_url(self, bucket: str) -> str:
        if self._path_style or "." in bucket:
            return f"{self._endpoint}/{bucket}"
        scheme, _, host = self._endpoint.partition("://")
        return f"{scheme}://{bucket}.{host}"

    def _object_url(self, bucket: str, key: str) -> str:
        return f"{self._bucket_url(bucket)}/{quote(key, safe='/~')}"

    def _fetch_url(self, url: str) -> str:
        bucket, key = split_s3_url(url)
        return self._object_url(bucket, key)

    # -- signing -------------------------------------------------------------------

    async def _credentials(self) -> Any:
        if self._botocore_credentials is None:
            return None
        if time.monotonic() - self._frozen_at > _CREDENTIAL_TTL:
            self._frozen = await asyncio.to_thread(
                self._botocore_credentials.get_frozen_credentials
            )
            self._frozen_at = time.monotonic()
        return self._frozen

    async def _prepare(
        self, blob_url: str, fetch_url: str, headers: dict[str, str], method: str = "GET"
    ) -> dict[str, str]:
        await self._setup()
        frozen = await self._credentials()
        if frozen is None:
            return headers
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=fetch_url, headers=headers)
        S3SigV4Auth(frozen, "s3", self._region).add_auth(request)
        return dict(request.headers.items())

    async def object_checksums(self, url: str) -> dict[str, str]:
        """The ``x-amz-checksum-*`` of an object uploaded with one (a HEAD in checksum
        mode: ranged GETs never carry it). Composite checksums of multipart uploads
        (``<digest>-<parts>``) are not digests of the bytes and are left out."""
        await self._setup()
        fetch_url = self._fetch_url(url)
        headers: dict[str, str] = await self._retrying(
            url, 0, 0, partial(self._head_checksums, url, fetch_url)
        )
        return headers

    async def _head_checksums(self, url: str, fetch_url: str) -> dict[str, str]:
        session = await self._client()
        headers = await self._prepare(url, fetch_url, {"x-amz-checksum-mode": "ENABLED"}, "HEAD")
        try:
            async with session.head(
                self._target(fetch_url), headers=headers, allow_redirects=False
            ) as response:
                await self._check_status(url, response, None)
                return {
                    name.lower(): value
                    for name, value in response.headers.items()
                    if name.lower().startswith("x-amz-checksum-")
                    and name.lower() != "x-amz-checksum-type"
                    and "-" not in value
                }
        except self._transport_errors() as exc:
            from .http import _Retryable

            raise _Retryable(str(exc) or type(exc).__name__) from exc

    # -- errors --------------------------------------------------------------------

    async def _error_detail(self, response: Any) -> str:
        try:
            body = await response.content.read(8192)
            root = ET.fromstring(body)
        except Exception:  # not XML, or the connection dropped: the status must do
            return f"{response.reason or ''}".strip()
        code = _xml_text(root, "Code") or ""
        message = _xml_text(root, "Message") or ""
        return f"{code}: {message}".strip(": ")

    def _describe_denied(self, url: str, status: int, detail: str) -> str:
        info = self._session_info
        return (
            f"{url}: access denied (HTTP {status} {detail}). Sent with credentials "
            f"{info.get('credentials')}, profile {info.get('profile')}, endpoint "
            f"{self._endpoint}, region {self._region}, "
            f"{'path-style' if self._path_style else 'virtual-hosted'} addressing. Check that "
            "these credentials may read the object; for MinIO/Ceph RGW and other S3-compatible "
            "stores set AWS_ENDPOINT_URL, use path-style addressing "
            "(AIOLOADER_S3_ADDRESSING=path) and AWS_EC2_METADATA_DISABLED=true"
        )

    # -- listing -------------------------------------------------------------------

    async def list_dir(self, url: str) -> list[str] | None:
        await self._setup()
        bucket, key = split_s3_url(url)
        if key.endswith((".safetensors", ".json")):
            return None
        prefix = key if key.endswith("/") or key == "" else key + "/"
        names = await self._list(url, bucket, prefix)
        if not names and key and not key.endswith("/"):
            return None  # not a prefix: let open() say whether the object exists
        return names

    async def _list(self, url: str, bucket: str, prefix: str) -> list[str]:
        names: list[str] = []
        token: str | None = None
        while True:
            params = {"list-type": "2", "prefix": prefix, "delimiter": "/"}
            if token:
                params["continuation-token"] = token
            query = urlencode(sorted(params.items()), quote_via=quote, safe="~")
            fetch_url = f"{self._bucket_url(bucket)}/?{query}"
            body: bytes = await self._retrying(url, 0, 0, partial(self._list_page, url, fetch_url))
            root = ET.fromstring(body)
            for item in root.iter(_NS + "Contents"):
                name = _xml_text(item, "Key") or ""
                if name.startswith(prefix) and name != prefix:
                    names.append(name[len(prefix) :])
            truncated = (_xml_text(root, "IsTruncated") or "false").lower() == "true"
            token = _xml_text(root, "NextContinuationToken")
            if not truncated or not token:
                return sorted(names)

    async def _list_page(self, url: str, fetch_url: str) -> bytes:
        try:
            response = await self._request(url, fetch_url, {})
            async with response:
                if response.status == 404:
                    detail = await self._error_detail(response)
                    bucket, _ = split_s3_url(url)
                    raise NotFoundError(
                        f"{url}: {detail or 'not found'}; check the bucket name {bucket!r} and "
                        f"the endpoint {self._endpoint}"
                    )
                await self._check_status(url, response, None)
                return await response.read()  # type: ignore[no-any-return]
        except self._transport_errors() as exc:
            from .http import _Retryable

            raise _Retryable(str(exc) or type(exc).__name__) from exc

    def join(self, base: str, name: str) -> str:
        return base.rstrip("/") + "/" + name

    def parent(self, url: str) -> str:
        return url.rsplit("/", 1)[0]

    async def open(self, url: str) -> Any:
        await self._setup()
        try:
            return await super().open(url)
        except NotFoundError as exc:
            raise NotFoundError(
                f"{url} does not exist at {self._endpoint} ({exc}); check the bucket and key"
            ) from exc
        except SourceError:
            raise
