"""Azure's Signer: SAS tokens, a bearer token, or nothing, through Azure's own libraries.

Credentials, the first that applies (``pip install "aioloader[azure]"``), never
signed by code of ours:

1. a SAS token already in the URL's query, or in ``AZURE_STORAGE_SAS_TOKEN``;
2. an account key (``AccountKey`` of the connection string, or
   ``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_ACCOUNT_KEY``): ``azure-storage-blob``
   makes a read-only SAS for the container from it, renewed before it expires;
3. ``azure-identity``'s ``DefaultAzureCredential`` (workload identity, managed
   identity, service principal in the environment, Azure CLI) when the
   environment names one (``AZURE_CLIENT_ID``, ``AZURE_FEDERATED_TOKEN_FILE``,
   ``IDENTITY_ENDPOINT``) or ``AIOLOADER_AZURE_IDENTITY=1``: a bearer token;
4. otherwise anonymous (public containers).

The SAS or key of the environment goes only to the account it names
(``AccountName`` / ``AZURE_STORAGE_ACCOUNT_NAME``, at its endpoint), never to another.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import ssl
import time
import xml.etree.ElementTree as ET
from concurrent.futures import Executor
from typing import Any

from ...errors import ConfigError
from ...redact import redact
from ...runtime.threads import run_in
from ...settings.resolver import resolve
from ...settings.table import AZURE_IDENTITY
from ..http.signer import reason_of
from .settings import AzureSettings
from .url import AzureBlobAddress

__all__ = ["API_VERSION", "AzureSigner"]

API_VERSION = "2021-08-06"
_SAS_LIFETIME = datetime.timedelta(hours=2)
_RENEW_BEFORE = 600.0  # seconds


class AzureSigner:
    """SAS tokens (given or made from an account key), a bearer token, or nothing."""

    follow_redirects = False
    encoded_urls = True

    def __init__(self, lane: Executor, identity: bool | None = None) -> None:
        """``identity``: ask azure-identity for a token when no SAS or key applies
        (``None``: ``AIOLOADER_AZURE_IDENTITY``); it is asked anyway when an identity is
        named (``AZURE_CLIENT_ID`` ...)."""
        self._lane = lane  # credential calls block: they run here
        self._identity = identity
        self._lock = asyncio.Lock()
        self._credential: Any = None
        self._token: Any = None
        self._sas: dict[tuple[str, str], tuple[str, float]] = {}
        self.described = "anonymously"
        self._mode: str | None = None
        self._settings = AzureSettings()

    async def setup(self, where: AzureBlobAddress) -> None:
        async with self._lock:
            if self._mode is not None:
                return
            settings = self._settings = AzureSettings.from_environ()
            key = settings.key
            # The environment's SAS and key belong to the account it names: never sent
            # to another account, or to another endpoint.
            elsewhere = settings.names_another(where.account, where.endpoint)
            if where.url_sas:
                self._mode, self.described = "url", "with the SAS token in the URL"
            elif elsewhere and (key or settings.sas):
                self._mode = "anonymous"
                self.described = (
                    f"anonymously (the SAS token or account key in the environment is for "
                    f"account {settings.account} at {settings.endpoint}, not {where.account} "
                    f"at {where.endpoint})"
                )
            elif settings.sas:
                self._mode = "env-sas"
                self.described = "with the SAS token in AZURE_STORAGE_SAS_TOKEN"
            elif key:
                self._mode = "key"
                self.described = (
                    f"with a read-only SAS made from the account key of {where.account} "
                    f"(from {settings.key_from})"
                )
            elif _identity_wanted(self._identity):
                self._credential = await run_in(self._lane, _default_credential)
                self._mode, self.described = "token", "with DefaultAzureCredential (azure-identity)"
            else:
                self._mode = "anonymous"
                self.described = "anonymously (no SAS, account key or Azure identity is configured)"

    async def query(self, where: AzureBlobAddress) -> str:
        """The SAS query to add to requests for ``where``'s container ('' for none)."""
        if self._mode == "url":
            return where.url_sas
        if self._mode == "env-sas":
            return self._settings.sas.lstrip("?")
        if self._mode != "key":
            return ""
        slot = (where.account, where.container)
        token, expires = self._sas.get(slot, ("", 0.0))
        if time.time() > expires - _RENEW_BEFORE:
            token = await run_in(self._lane, _container_sas, where, self._settings.key)
            expires = time.time() + _SAS_LIFETIME.total_seconds()
            self._sas[slot] = (token, expires)
        return token

    async def ssl_context(self) -> ssl.SSLContext | None:
        return None

    async def sign(
        self, method: str, url: str, headers: dict[str, str], *, origin: str
    ) -> dict[str, str]:
        headers = {**headers, "x-ms-version": API_VERSION}
        if self._mode == "token":  # redirects are not followed: url is the store's own
            now = time.time()
            if self._token is None or self._token.expires_on - now < _RENEW_BEFORE:
                self._token = await run_in(
                    self._lane, self._credential.get_token, "https://storage.azure.com/.default"
                )
            headers["Authorization"] = f"Bearer {self._token.token}"
        return headers

    async def error_detail(self, response: Any) -> str:
        try:
            root = ET.fromstring(await response.read())
            code = root.findtext("Code") or ""
            message = (root.findtext("Message") or "").splitlines()[0]
            return f"{code}: {message}".strip(": ")[:300]
        except Exception:
            return reason_of(response)

    def describe_denied(self, url: str, status: int, detail: str) -> str:
        return (
            f"{redact(url)}: HTTP {status} {detail}; the request was sent {self.described}. "
            "Check that the credentials may read this container (a SAS with read and list "
            "permissions, or the role Storage Blob Data Reader)"
        )


def _identity_wanted(given: bool | None) -> bool:
    names = ("AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT")
    return bool(resolve(AZURE_IDENTITY, given)) or any(os.environ.get(n) for n in names)


def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise ConfigError(
            "an Azure identity is configured but azure-identity is not installed: "
            "pip install 'aioloader[azure]'"
        ) from exc
    return DefaultAzureCredential()


def _container_sas(where: AzureBlobAddress, key: str | None) -> str:
    try:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    except ImportError as exc:
        raise ConfigError(
            "an Azure account key is configured but azure-storage-blob, which turns it into "
            "a SAS token, is not installed: pip install 'aioloader[azure]'"
        ) from exc
    token: str = generate_container_sas(
        where.account,
        where.container,
        account_key=key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + _SAS_LIFETIME,
    )
    return token
