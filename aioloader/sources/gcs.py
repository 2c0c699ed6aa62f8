"""Google Cloud Storage: ``gs://bucket/object``, range reads through the HTTP transport.

Objects are read with the JSON API's media download, pinned to the object's
*generation*: opening a file asks for its metadata (size, generation), and every
range read names that generation, so a file overwritten during a load fails
(404 for the old generation) instead of mixing two versions. The generation is
also the version the node cache keys an entry on.

Credentials come from ``google-auth`` (``pip install "aioloader[gcs]"``), never
from code of ours: application default credentials (a service-account JSON in
``GOOGLE_APPLICATION_CREDENTIALS``, workload identity or the metadata server,
``gcloud`` user credentials). Without any, requests go anonymous (public
buckets). ``STORAGE_EMULATOR_HOST`` points everything at an emulator, anonymous,
as Google's own client libraries do.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode, urlparse

from ..config import HttpOptions
from ..errors import ConfigError, SourceError
from ..redact import redact
from ..throttle import LimiterStatistics
from .base import Blob, Source
from .http.listing import listed, prefix_to_list
from .http.rules import same_origin
from .http.store import HttpStore

__all__ = ["GcsSource", "split_gs_url"]

ENDPOINT = "https://storage.googleapis.com"
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_only",)


def split_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/some/object`` -> ``("bucket", "some/object")``."""
    parsed = urlparse(url)
    if parsed.scheme != "gs" or not parsed.netloc:
        raise ConfigError(f"{url} is not a Google Cloud Storage URL; write gs://bucket/object")
    return parsed.netloc, parsed.path.lstrip("/")


class GcsSigner:
    """Bearer tokens from google-auth's application default credentials, or none."""

    follow_redirects = True
    encoded_urls = True

    def __init__(self) -> None:
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator and "://" not in emulator:
            emulator = "http://" + emulator
        self.endpoint = (emulator or ENDPOINT).rstrip("/")
        self.emulator = bool(emulator)
        self._credentials: Any = None
        self._described = "anonymously"
        self._ready = False
        self._lock = asyncio.Lock()

    async def setup(self) -> None:
        """Find the credentials once (google-auth may ask the metadata server: a thread)."""
        async with self._lock:
            if not self._ready:
                if not self.emulator:
                    self._credentials, self._described = await asyncio.to_thread(_find)
                self._ready = True

    async def ssl_context(self) -> ssl.SSLContext | None:
        return None

    async def sign(
        self, method: str, url: str, headers: dict[str, str], *, origin: str
    ) -> dict[str, str]:
        credentials = self._credentials
        if credentials is None or not same_origin(url, self.endpoint):
            return headers
        if not credentials.valid:
            async with self._lock:
                if not credentials.valid:
                    await asyncio.to_thread(_refresh, credentials)
        return {**headers, "Authorization": f"Bearer {credentials.token}"}

    async def error_detail(self, response: Any) -> str:
        try:
            body = await response.read()
            message = json.loads(body)["error"]["message"]
            return str(message)[:300]
        except Exception:
            return f"{response.reason or ''}".strip()

    def describe_denied(self, url: str, status: int, detail: str) -> str:
        return (
            f"{redact(url)}: HTTP {status} {detail}; the request was sent {self._described}. "
            "Check that these credentials may read the object (roles/storage.objectViewer), "
            "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key that may"
        )


def _find() -> tuple[Any, str]:
    """Application default credentials and how to name them; (None, ...) for none."""
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        return None, "anonymously (google-auth is not installed: pip install 'aioloader[gcs]')"
    where = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    try:
        credentials, project = google.auth.default(scopes=list(SCOPES))
    except DefaultCredentialsError as exc:
        if where:  # named, so meant: not a reason to go anonymous
            raise ConfigError(
                f"GOOGLE_APPLICATION_CREDENTIALS={where} cannot be used ({exc}); point it at "
                "a service-account key file, or unset it"
            ) from exc
        return None, "anonymously (no Google application default credentials were found)"
    email = getattr(credentials, "service_account_email", None)
    who = f"service account {_mask(email)}" if email else type(credentials).__name__
    source = f" from GOOGLE_APPLICATION_CREDENTIALS={where}" if where else ""
    return credentials, f"with {who}{source} (project {project or 'unknown'})"


def _mask(email: str) -> str:
    name, _, domain = email.partition("@")
    return f"{name[:3]}***@{domain}" if domain else email


def _refresh(credentials: Any) -> None:
    from google.auth.transport.requests import Request

    credentials.refresh(Request())


class GcsBlob(Blob):
    """An object read at one generation; ``etag`` carries the generation for the cache."""

    def __init__(self, inner: Blob, generation: str) -> None:
        self.url = inner.url
        self.size = inner.size
        self._inner = inner
        self.generation = generation
        self.etag = f'"generation-{generation}"'
        self.last_modified = None

    def __repr__(self) -> str:
        return f"<GcsBlob {self.url!r} size={self.size} generation={self.generation}>"

    async def read_bytes(self, offset: int, length: int) -> bytes:
        return await self._inner.read_bytes(offset, length)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self._inner.read_into(offset, buffers)

    async def aclose(self) -> None:
        await self._inner.aclose()


class GcsSource(Source):
    """Objects in Google Cloud Storage (see the module docstring).

    Args:
        concurrency: the most requests in flight.
        http: retries and timeouts.
    """

    scheme_name = "GCS"

    def __init__(self, concurrency: int, http: HttpOptions | None = None) -> None:
        self._signer = GcsSigner()
        self._store = HttpStore(
            type(self).__name__, concurrency, http or HttpOptions(), self._signer
        )

    def __repr__(self) -> str:
        return f"<GcsSource endpoint={self._signer.endpoint}>"

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    def _api(self, bucket: str, key: str = "", *, download: bool = False) -> str:
        base = f"{self._signer.endpoint}{'/download' if download else ''}/storage/v1/b/"
        url = base + quote(bucket, safe="") + "/o"
        return url + ("/" + quote(key, safe="") if key else "")

    async def _get_json(self, url: str, fetch_url: str, missing: str, what: str) -> dict[str, Any]:
        body = await self._store.read_body(url, fetch_url, lambda _: missing)
        try:
            document = json.loads(body)
        except ValueError as exc:  # UnicodeDecodeError too
            raise self._broken(url, what, f"it is not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise self._broken(url, what, f"it is a JSON {type(document).__name__}, not an object")
        return document

    def _broken(self, url: str, what: str, problem: str) -> SourceError:
        hint = (
            "check that STORAGE_EMULATOR_HOST points at a Cloud Storage emulator"
            if self._signer.emulator
            else "a proxy or captive portal may stand between; check the network path"
        )
        return SourceError(
            f"{redact(url)}: the {what} that {self._signer.endpoint} sent is not Cloud "
            f"Storage's: {problem}; {hint}"
        )

    async def list_dir(self, url: str) -> list[str] | None:
        await self._signer.setup()
        bucket, key = split_gs_url(url)
        prefix = prefix_to_list(key)
        if prefix is None:
            return None
        names: list[str] = []
        token = None
        while True:
            params = {"prefix": prefix, "delimiter": "/", "fields": "items(name),nextPageToken"}
            if token:
                params["pageToken"] = token
            page = await self._get_json(
                url,
                f"{self._api(bucket)}?{urlencode(params)}",
                f"{url}: bucket {bucket!r} does not exist at {self._signer.endpoint}",
                "listing",
            )
            items = page.get("items", [])
            if not isinstance(items, list) or not all(
                isinstance(i, dict) and isinstance(i.get("name"), str) for i in items
            ):
                raise self._broken(url, "listing", "its items are not objects with a name")
            names += [i["name"][len(prefix) :] for i in items if i["name"] != prefix]
            token = page.get("nextPageToken")
            if token is not None and not isinstance(token, str):
                raise self._broken(url, "listing", "its nextPageToken is not a string")
            if not token:
                return listed(names, key)

    async def open(self, url: str) -> Blob:
        await self._signer.setup()
        bucket, key = split_gs_url(url)
        if not key:
            raise SourceError(f"{url} names a bucket, not an object or a prefix/")
        meta = await self._get_json(
            url,
            self._api(bucket, key) + "?fields=generation,size",
            f"{url} does not exist at {self._signer.endpoint}; check the bucket and object name",
            "object metadata",
        )
        generation = str(meta.get("generation", ""))
        if not (generation.isascii() and generation.isdigit()):
            raise self._broken(url, "object metadata", "it gives no generation number")
        fetch_url = (
            self._api(bucket, key, download=True)
            + "?"
            + urlencode({"alt": "media", "generation": generation})
        )
        return GcsBlob(await self._store.open(url, fetch_url), generation)

    async def aclose(self) -> None:
        await self._store.aclose()
