"""Azure Blob Storage: ``az://container/path`` and ``https://<account>.blob.core.windows.net/...``.

Range GETs through the HTTP transport, pinned to the blob's ETag (``If-Match``),
and container listing by prefix. The account and its endpoint come from the URL
(``https://<account>.blob.core.windows.net/``), else from
``AZURE_STORAGE_CONNECTION_STRING`` (``AccountName``, ``BlobEndpoint``: Azurite's
too) or ``AZURE_STORAGE_ACCOUNT_NAME``.

Credentials, the first that applies, through Azure's own libraries (``pip install
"aioloader[azure]"``), never signed by code of ours:

1. a SAS token already in the URL's query, or in ``AZURE_STORAGE_SAS_TOKEN``;
2. an account key (``AccountKey`` of the connection string, or
   ``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_ACCOUNT_KEY``): ``azure-storage-blob``
   makes a read-only SAS for the container from it, renewed before it expires;
3. ``azure-identity``'s ``DefaultAzureCredential`` (workload identity, managed
   identity, service principal in the environment, Azure CLI) when the
   environment names one (``AZURE_CLIENT_ID``, ``AZURE_FEDERATED_TOKEN_FILE``,
   ``IDENTITY_ENDPOINT``) or ``AIOLOADER_AZURE_IDENTITY=1``: a bearer token;
4. otherwise anonymous (public containers).

A source serves one account (a Loader keeps one per account: ``store_of`` in
auto.py), and the SAS or key of the environment goes only to the account it names
(``AccountName`` / ``AZURE_STORAGE_ACCOUNT_NAME``, at its endpoint), never to another.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import ssl
import time
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import quote, urlencode, urlparse

from ..config import HttpOptions
from ..errors import ConfigError, NotFoundError, SourceError
from ..redact import redact
from ..throttle import LimiterStatistics
from .base import Blob, Source
from .http.listing import broken_listing, listed, prefix_to_list, xml_listing
from .http.store import HttpStore

__all__ = ["AzureSource", "azure_store", "is_azure_url"]

API_VERSION = "2021-08-06"
_SUFFIX = ".blob.core.windows.net"
_SAS_LIFETIME = datetime.timedelta(hours=2)
_RENEW_BEFORE = 600.0  # seconds


def is_azure_url(url: str) -> bool:
    """``az://...`` or an ``https://<account>.blob.core.windows.net/...`` URL."""
    parsed = urlparse(url)
    return parsed.scheme == "az" or (
        parsed.scheme in ("http", "https") and (parsed.hostname or "").endswith(_SUFFIX)
    )


def _connection_string() -> dict[str, str]:
    text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    parts = (item.partition("=") for item in text.split(";") if "=" in item)
    return {key.strip(): value.strip() for key, _, value in parts}


def _named_account() -> tuple[str, str] | None:
    """The account the environment names and its blob endpoint, or None."""
    settings = _connection_string()
    account = settings.get("AccountName") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        return None
    return account, (settings.get("BlobEndpoint") or f"https://{account}{_SUFFIX}").rstrip("/")


def azure_store(url: str) -> str:
    """The account a URL's blob is in, as ``<endpoint> <account>`` (``?`` where the
    environment names none): a source and its credentials serve one account only."""
    parsed = urlparse(url)
    if parsed.scheme == "az":
        named = _named_account()
        return "? ?" if named is None else f"{named[1].lower()} {named[0]}"
    host = (parsed.hostname or "").lower()
    return f"{parsed.scheme.lower()}://{parsed.netloc.lower()} {host.removesuffix(_SUFFIX)}"


class _Location:
    """Where a URL's blob lives: endpoint, account, container, name, and a SAS in the URL."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        if parsed.scheme == "az":
            self.container = parsed.netloc
            self.name = parsed.path.lstrip("/")
            named = _named_account()
            if named is None:
                raise ConfigError(
                    f"{url}: no Azure storage account is set; set AZURE_STORAGE_CONNECTION_STRING "
                    "or AZURE_STORAGE_ACCOUNT_NAME, or give the URL as "
                    "https://<account>.blob.core.windows.net/<container>/<path>"
                )
            self.account, self.endpoint = named
            self.url_sas = ""
        else:
            self.account = (parsed.hostname or "").removesuffix(_SUFFIX)
            self.endpoint = f"{parsed.scheme}://{parsed.netloc}"
            container, _, name = parsed.path.lstrip("/").partition("/")
            self.container, self.name = container, name
            self.url_sas = parsed.query
        if not self.container:
            raise ConfigError(f"{redact(url)} names no container; write az://<container>/<path>")

    @property
    def container_url(self) -> str:
        return f"{self.endpoint}/{quote(self.container, safe='')}"

    def blob_url(self, name: str | None = None) -> str:
        return f"{self.container_url}/{quote(self.name if name is None else name, safe='/~')}"


class AzureSigner:
    """SAS tokens (given or made from an account key), a bearer token, or nothing."""

    follow_redirects = False
    encoded_urls = True

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._credential: Any = None
        self._token: Any = None
        self._sas: dict[tuple[str, str], tuple[str, float]] = {}
        self.described = "anonymously"
        self._mode: str | None = None

    async def setup(self, where: _Location) -> None:
        async with self._lock:
            if self._mode is not None:
                return
            settings = _connection_string()
            key = settings.get("AccountKey") or _env_key()
            named = _named_account()
            # The environment's SAS and key belong to the account it names: never sent
            # to another account, or to another endpoint.
            elsewhere = named is not None and (
                named[0] != where.account or named[1].lower() != where.endpoint.lower()
            )
            if where.url_sas:
                self._mode, self.described = "url", "with the SAS token in the URL"
            elif elsewhere and (key or os.environ.get("AZURE_STORAGE_SAS_TOKEN")):
                assert named is not None
                self._mode = "anonymous"
                self.described = (
                    f"anonymously (the SAS token or account key in the environment is for "
                    f"account {named[0]} at {named[1]}, not {where.account} at {where.endpoint})"
                )
            elif os.environ.get("AZURE_STORAGE_SAS_TOKEN"):
                self._mode = "env-sas"
                self.described = "with the SAS token in AZURE_STORAGE_SAS_TOKEN"
            elif key:
                self._mode = "key"
                source = (
                    "AZURE_STORAGE_CONNECTION_STRING" if settings.get("AccountKey")
                    else _KEY_NAMES[0] if os.environ.get(_KEY_NAMES[0]) else _KEY_NAMES[1]
                )  # fmt: skip
                self.described = (
                    f"with a read-only SAS made from the account key of {where.account} "
                    f"(from {source})"
                )
            elif _identity_wanted():
                self._credential = await asyncio.to_thread(_default_credential)
                self._mode, self.described = "token", "with DefaultAzureCredential (azure-identity)"
            else:
                self._mode = "anonymous"
                self.described = "anonymously (no SAS, account key or Azure identity is configured)"

    async def query(self, where: _Location) -> str:
        """The SAS query to add to requests for ``where``'s container ('' for none)."""
        if self._mode == "url":
            return where.url_sas
        if self._mode == "env-sas":
            return os.environ["AZURE_STORAGE_SAS_TOKEN"].lstrip("?")
        if self._mode != "key":
            return ""
        slot = (where.account, where.container)
        token, expires = self._sas.get(slot, ("", 0.0))
        if time.time() > expires - _RENEW_BEFORE:
            token = await asyncio.to_thread(_container_sas, where)
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
                self._token = await asyncio.to_thread(
                    self._credential.get_token, "https://storage.azure.com/.default"
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
            return f"{response.reason or ''}".strip()

    def describe_denied(self, url: str, status: int, detail: str) -> str:
        return (
            f"{redact(url)}: HTTP {status} {detail}; the request was sent {self.described}. "
            "Check that the credentials may read this container (a SAS with read and list "
            "permissions, or the role Storage Blob Data Reader)"
        )


_KEY_NAMES = ("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY")  # the CLI's, and another usual


def _env_key() -> str | None:
    return next((os.environ[n] for n in _KEY_NAMES if os.environ.get(n)), None)


def _identity_wanted() -> bool:
    names = ("AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT")
    return os.environ.get("AIOLOADER_AZURE_IDENTITY") == "1" or any(
        os.environ.get(n) for n in names
    )


def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise ConfigError(
            "an Azure identity is configured but azure-identity is not installed: "
            "pip install 'aioloader[azure]'"
        ) from exc
    return DefaultAzureCredential()


def _container_sas(where: _Location) -> str:
    try:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    except ImportError as exc:
        raise ConfigError(
            "an Azure account key is configured but azure-storage-blob, which turns it into "
            "a SAS token, is not installed: pip install 'aioloader[azure]'"
        ) from exc
    key = _connection_string().get("AccountKey") or _env_key()
    token: str = generate_container_sas(
        where.account,
        where.container,
        account_key=key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + _SAS_LIFETIME,
    )
    return token


def _with_query(url: str, *queries: str) -> str:
    joined = "&".join(q for q in queries if q)
    return f"{url}?{joined}" if joined else url


class AzureSource(Source):
    """Blobs in Azure Blob Storage or Azurite (see the module docstring).

    Args:
        concurrency: the most requests in flight.
        http: retries and timeouts.
    """

    scheme_name = "Azure Blob Storage"

    def __init__(self, concurrency: int, http: HttpOptions | None = None) -> None:
        self._signer = AzureSigner()
        self._store = HttpStore(
            type(self).__name__, concurrency, http or HttpOptions(), self._signer
        )

    def __repr__(self) -> str:
        return f"<AzureSource {self._signer.described}>"

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    async def list_dir(self, url: str) -> list[str] | None:
        where = _Location(url)
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
            fetch_url = _with_query(where.container_url, query, await self._signer.query(where))
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
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return listed(names, where.name)

    async def open(self, url: str) -> Blob:
        where = _Location(url)
        await self._signer.setup(where)
        if not where.name:
            raise SourceError(f"{redact(url)} names a container, not a blob or a prefix/")
        fetch_url = _with_query(where.blob_url(), await self._signer.query(where))
        try:
            return await self._store.open(url, fetch_url)
        except NotFoundError as exc:
            raise NotFoundError(
                f"{redact(url)} does not exist in container {where.container!r} of account "
                f"{where.account!r} ({exc}); check the container and blob name"
            ) from exc

    def join(self, base: str, name: str) -> str:
        parsed = urlparse(base)
        path = parsed.path.rstrip("/") + "/" + name
        return parsed._replace(path=path).geturl()

    def parent(self, url: str) -> str:
        parsed = urlparse(url)
        return parsed._replace(path=parsed.path.rsplit("/", 1)[0]).geturl()

    async def aclose(self) -> None:
        await self._store.aclose()
