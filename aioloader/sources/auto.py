"""Pick the storage backend for a URL.

Each backend is imported when a URL of its kind is first used, so that importing
aioloader imports neither aiohttp nor the remote stores' modules.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from ..config import HttpOptions, S3Options
from ..errors import ConfigError
from ..threads import Lanes
from .base import Source

__all__ = ["scheme_of", "source_for", "store_of"]


def scheme_of(url: str) -> str:
    """``file`` for paths and file:// URLs, else the lower-cased URL scheme.

    Raises:
        ConfigError: ``url`` cannot be parsed (``http://[bad``: a bracket not closed).
    """
    try:
        scheme = urlparse(url).scheme.lower()
    except ValueError as exc:  # "Invalid IPv6 URL", a host in brackets that is no address
        raise ConfigError(f"{url!r} is not a valid URL ({exc}); check it for typos") from None
    # A one-letter scheme is a Windows drive ("C:\\..."), not a URL.
    return "file" if len(scheme) <= 1 else scheme


def _is_azure(url: str) -> bool:
    scheme = scheme_of(url)
    if scheme not in ("az", "https"):
        return False
    from .azure.url import is_azure_url

    return scheme == "az" or is_azure_url(url)


def store_of(url: str) -> str:
    """The store ``url`` is read from, the key a long-lived Loader keeps a Source under.

    One Source serves one store with one set of credentials: an Azure account (its
    endpoint and name: a SAS or token for one account must never reach another host),
    else every URL of a scheme, whose sources send nothing to a host but what was
    configured for it (HTTP headers only to the URL's own origin; S3 and GCS only to
    their one endpoint; the Hugging Face token only to the Hub's endpoint).
    """
    if _is_azure(url):
        from .azure.url import azure_store

        return f"azure {azure_store(url)}"
    return scheme_of(url)


def source_for(
    url: str,
    *,
    lanes: Lanes,
    http: HttpOptions | None = None,
    s3: S3Options | None = None,
    hf_check: Any = None,
) -> Source:
    """A new Source able to read ``url``, with the threads of ``lanes`` (owned by the
    caller, closed after the source); ``lanes.concurrency`` bounds its requests.
    ``hf_check`` is how an ``hf://`` source checks a branch the hub cache holds (a
    ``RevisionCheck``, sources/hf/revision.py; None: the defaults).

    Raises:
        ConfigError: no backend reads this kind of URL.
    """
    scheme = scheme_of(url)
    if _is_azure(url):
        from .azure.source import AzureSource

        return AzureSource(lanes, http)
    if scheme == "file":
        from .file import FileSource

        return FileSource(lanes)
    if scheme in ("http", "https"):
        from .http.source import HttpSource

        return HttpSource(lanes, http)
    if scheme == "s3":
        from .s3.source import S3Source

        return S3Source(lanes, http, s3)
    if scheme == "gs":
        from .gcs.source import GcsSource

        return GcsSource(lanes, http)
    if scheme == "hf":
        from .hf.source import HfSource

        return HfSource(lanes, http, hf_check)
    raise ConfigError(
        f"{url}: URL scheme {scheme!r} is not supported; aioloader reads local paths, "
        "file://, http://, https://, s3://, gs://, az:// and hf:// URLs"
    )
