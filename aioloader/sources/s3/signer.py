"""S3's Signer: configuration, credentials and AWS Signature V4 for the HTTP transport.

Credentials, region and profiles come from botocore's standard chain
(environment, shared config and credentials files, web identity, instance
metadata), never from a chain of our own. Each request is signed by botocore,
with credentials frozen and refreshed off the event loop, so signing stays a
small fixed cost per multi-megabyte request.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
import time
import xml.etree.ElementTree as ET
from concurrent.futures import Executor
from typing import Any
from urllib.parse import urlparse

from ...errors import ConfigError
from ...redact import redacting_logger
from ...runtime.threads import run_in
from ...settings.values import S3Options
from ..http.signer import reason_of

__all__ = ["S3_NAMESPACE", "S3Signer", "xml_text"]

# Credentials are re-read (off the loop) at least this often, so refreshable
# ones (web identity, instance roles) never go stale mid-load.
_CREDENTIAL_TTL = 60.0
S3_NAMESPACE = "{http://s3.amazonaws.com/doc/2006-03-01/}"


logger = redacting_logger(__name__)

# Said once per process: every S3 source of a process finds the same (missing) chain.
_warned_unsigned = False


def _warn_unsigned(endpoint: str) -> None:
    global _warned_unsigned
    if _warned_unsigned:
        return
    _warned_unsigned = True
    logger.warning(
        "no AWS credentials were found (environment, shared files, web identity, instance "
        "metadata): s3:// requests to %s go unsigned, which only public buckets allow. Set "
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE to sign them, or pass "
        "s3_anonymous=True (--s3-anonymous) to read a public bucket without this warning",
        endpoint,
    )


def xml_text(element: ET.Element, tag: str) -> str | None:
    """The text of ``element``'s child ``tag``, with or without S3's namespace."""
    found = element.find(S3_NAMESPACE + tag)
    if found is None:
        found = element.find(tag)
    return found.text if found is not None else None


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


class S3Signer:
    """Signs requests to an S3-compatible store; resolves its settings on first use.

    Args:
        options: endpoint, region, addressing style, anonymous access, profile.

    Attributes (valid once ``setup`` has run):
        endpoint: the store's base URL, without a trailing slash.
        region: the signing region.
        path_style: buckets go in the path, not in the host name.
    """

    follow_redirects = False  # a redirect would carry a signature made for another host
    encoded_urls = True  # keys are percent-encoded exactly as signed

    def __init__(self, options: S3Options, lane: Executor) -> None:
        self._lane = lane  # botocore blocks: it runs here
        self._options = options
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._session_info: dict[str, Any] = {}
        self._botocore_credentials: Any = None
        self._frozen: Any = None
        self._frozen_at = 0.0
        self.endpoint = ""
        self.region = "us-east-1"
        self.path_style = True
        self._ca_bundle: str | None = None

    async def setup(self) -> None:
        """Resolve endpoint, region and credentials, once and off the event loop.

        Raises:
            ConfigError: botocore is missing, or virtual-hosted addressing meets an IP endpoint.
        """
        if self._ready:
            return
        async with self._ready_lock:
            if not self._ready:
                await run_in(self._lane, self._resolve)
                self._ready = True

    def _resolve(self) -> None:
        try:
            import botocore.session
        except ImportError as exc:  # pragma: no cover - declared dependency
            raise ConfigError("reading s3:// URLs needs botocore: pip install botocore") from exc
        options = self._options
        session = botocore.session.Session(profile=options.profile)
        endpoint = (
            options.endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        region = options.region or session.get_config_variable("region") or "us-east-1"
        addressing = options.addressing  # checked by S3Options
        self.path_style = addressing == "path" or (addressing == "auto" and endpoint is not None)
        self.endpoint = (endpoint or f"https://s3.{region}.amazonaws.com").rstrip("/")
        if not self.path_style and _is_ip_address(self.endpoint):
            # bucket.10.0.0.5 resolves nowhere: every request would fail on DNS, retried
            # until attempts run out, with a message that hides the cause.
            raise ConfigError(
                f"virtual-hosted S3 addressing puts the bucket in the host name, which the "
                f"endpoint {self.endpoint} (an IP address) cannot have; use path-style "
                "addressing: s3_addressing='path' (AIOLOADER_S3_ADDRESSING=path, or "
                "S3Options(addressing='path'))"
            )
        self.region = region
        self._ca_bundle = os.environ.get("AWS_CA_BUNDLE") or session.get_config_variable(
            "ca_bundle"
        )
        credentials = None if options.anonymous else session.get_credentials()
        if credentials is None and not options.anonymous:
            _warn_unsigned(self.endpoint)
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

    async def ssl_context(self) -> ssl.SSLContext | None:
        await self.setup()
        if self._ca_bundle:
            return ssl.create_default_context(cafile=self._ca_bundle)
        return None

    async def _credentials(self) -> Any:
        if self._botocore_credentials is None:
            return None
        if time.monotonic() - self._frozen_at > _CREDENTIAL_TTL:
            self._frozen = await run_in(
                self._lane, self._botocore_credentials.get_frozen_credentials
            )
            self._frozen_at = time.monotonic()
        return self._frozen

    async def sign(
        self, method: str, url: str, headers: dict[str, str], *, origin: str
    ) -> dict[str, str]:
        """``headers`` plus AWS Signature V4 (unchanged for anonymous access)."""
        await self.setup()
        frozen = await self._credentials()
        if frozen is None:
            return headers
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=url, headers=headers)
        S3SigV4Auth(frozen, "s3", self.region).add_auth(request)
        return dict(request.headers.items())

    async def error_detail(self, response: Any) -> str:
        """``Code: Message`` from S3's XML error document (the reason if there is none)."""
        try:
            body = await response.content.read(8192)
            root = ET.fromstring(body)
        except Exception:  # not XML, or the connection dropped: the status must do
            return reason_of(response)
        code = xml_text(root, "Code") or ""
        message = xml_text(root, "Message") or ""
        return f"{code}: {message}".strip(": ")

    def describe_denied(self, url: str, status: int, detail: str) -> str:
        info = self._session_info
        return (
            f"{url}: access denied (HTTP {status} {detail}). Sent with credentials "
            f"{info.get('credentials')}, profile {info.get('profile')}, endpoint "
            f"{self.endpoint}, region {self.region}, "
            f"{'path-style' if self.path_style else 'virtual-hosted'} addressing. Check that "
            "these credentials may read the object; for MinIO/Ceph RGW and other S3-compatible "
            "stores set AWS_ENDPOINT_URL, use path-style addressing "
            "(AIOLOADER_S3_ADDRESSING=path) and AWS_EC2_METADATA_DISABLED=true"
        )
