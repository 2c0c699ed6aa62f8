"""GCS's Signer: bearer tokens from google-auth's application default credentials.

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
from concurrent.futures import Executor
from typing import Any

from ...errors import ConfigError
from ...redact import redact
from ...runtime.threads import run_in
from ..http.rules import same_origin
from ..http.signer import reason_of
from .url import ENDPOINT

__all__ = ["GcsSigner"]

SCOPES = ("https://www.googleapis.com/auth/devstorage.read_only",)


class GcsSigner:
    """Bearer tokens from google-auth's application default credentials, or none."""

    follow_redirects = True
    encoded_urls = True

    def __init__(self, lane: Executor) -> None:
        self._lane = lane  # google-auth blocks: it runs here
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
                    self._credentials, self._described = await run_in(self._lane, _find)
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
                    await run_in(self._lane, _refresh, credentials)
        return {**headers, "Authorization": f"Bearer {credentials.token}"}

    async def error_detail(self, response: Any) -> str:
        try:
            body = await response.read()
            message = json.loads(body)["error"]["message"]
            return str(message)[:300]
        except Exception:
            return reason_of(response)

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
