"""Azure URLs: which account, endpoint, container and blob a URL names."""

from __future__ import annotations

from urllib.parse import quote, urlparse

from ...errors import ConfigError
from ...redact import redact
from ..bucket_url import split_bucket_url
from .settings import SUFFIX, AzureSettings

__all__ = ["AzureBlobAddress", "azure_store", "is_azure_url", "with_query"]


def is_azure_url(url: str) -> bool:
    """``az://...`` or an ``https://<account>.blob.core.windows.net/...`` URL."""
    parsed = urlparse(url)
    return parsed.scheme == "az" or (
        parsed.scheme in ("http", "https") and (parsed.hostname or "").endswith(SUFFIX)
    )


def azure_store(url: str) -> str:
    """The account a URL's blob is in, as ``<endpoint> <account>`` (``?`` where the
    environment names none): a source and its credentials serve one account only."""
    parsed = urlparse(url)
    if parsed.scheme == "az":
        named = AzureSettings.from_environ()
        return "? ?" if named.account is None else f"{named.endpoint.lower()} {named.account}"
    host = (parsed.hostname or "").lower()
    return f"{parsed.scheme.lower()}://{parsed.netloc.lower()} {host.removesuffix(SUFFIX)}"


class AzureBlobAddress:
    """Where a URL's blob lives: endpoint, account, container, name, and a SAS in the URL.

    ``az://container/path`` is in the account the environment names;
    ``https://<account>.blob.core.windows.net/container/path`` names its own.

    Raises:
        ConfigError: no account is named, or the URL names no container.
    """

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        if parsed.scheme == "az":
            # The name as written, "#" and "?" included (bucket_url.py).
            self.container, self.name = split_bucket_url(url, "az", "az://<container>/<path>")
            named = AzureSettings.from_environ()
            if named.account is None:
                raise ConfigError(
                    f"{url}: no Azure storage account is set; set AZURE_STORAGE_CONNECTION_STRING "
                    "or AZURE_STORAGE_ACCOUNT_NAME, or give the URL as "
                    "https://<account>.blob.core.windows.net/<container>/<path>"
                )
            self.account, self.endpoint = named.account, named.endpoint
            self.url_sas = ""
        else:
            self.account = (parsed.hostname or "").removesuffix(SUFFIX)
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


def with_query(url: str, *queries: str) -> str:
    """``url`` with the non-empty ``queries`` joined after ``?``."""
    joined = "&".join(q for q in queries if q)
    return f"{url}?{joined}" if joined else url
