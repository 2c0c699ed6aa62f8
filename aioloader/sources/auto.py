"""Pick the storage backend for a URL, from the scheme table (schemes.py).

Each backend is imported when a URL of its kind is first used, so that importing
aioloader imports neither aiohttp nor the remote stores' modules.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlparse

from ..errors import ConfigError
from ..runtime.threads import Lanes
from ..settings.values import HttpOptions, S3Options
from .base import Source
from .schemes import Scheme, listed, scheme_named

__all__ = ["backend_of", "scheme_of", "source_for", "store_of", "unsupported"]


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


def _is_azure(url: str, scheme: str) -> bool:
    if scheme not in ("az", "https"):
        return False
    from .azure.url import is_azure_url

    return scheme == "az" or is_azure_url(url)


def store_of(url: str, scheme: str | None = None) -> str:
    """The store ``url`` is read from, the key a long-lived Loader keeps a Source under
    (``scheme``: ``scheme_of(url)`` where the caller has it already).

    One Source serves one store with one set of credentials: an Azure account (its
    endpoint and name: a SAS or token for one account must never reach another host),
    else every URL of a scheme, whose sources send nothing to a host but what was
    configured for it (HTTP headers only to the URL's own origin; S3 and GCS only to
    their one endpoint; the Hugging Face token only to the Hub's endpoint).
    """
    scheme = scheme_of(url) if scheme is None else scheme
    if _is_azure(url, scheme):
        from .azure.url import azure_store

        return f"azure {azure_store(url)}"
    return scheme


def backend_of(url: str, scheme: str) -> Scheme | None:
    """The row of the backend that reads ``url`` (whose scheme is ``scheme``): an Azure
    account's https URLs are Azure's; None where no backend reads it."""
    return scheme_named("az") if _is_azure(url, scheme) else scheme_named(scheme)


def unsupported(url: str) -> ConfigError:
    """The error for a URL whose scheme no backend reads."""
    return ConfigError(
        f"{url}: URL scheme {scheme_of(url)!r} is not supported; aioloader reads local "
        f"paths, {listed()} URLs"
    )


def source_for(
    url: str,
    *,
    lanes: Lanes,
    http: HttpOptions | None = None,
    s3: S3Options | None = None,
    hf_check: Any = None,
    backend: Scheme | None = None,
) -> Source:
    """A new Source able to read ``url``, with the threads of ``lanes`` (owned by the
    caller, closed after the source); ``lanes.concurrency`` bounds its requests.
    ``hf_check`` is how an ``hf://`` source checks a branch the hub cache holds (a
    ``RevisionCheck``, sources/hf/revision.py; None: the defaults). ``backend``: its
    row where the caller found it already (``locate``), else found here.

    Raises:
        ConfigError: no backend reads this kind of URL.
    """
    row = backend if backend is not None else backend_of(url, scheme_of(url))
    if row is None:
        raise unsupported(url)
    module = importlib.import_module(f"{__package__}.{row.module}")
    settings = {"http": http, "s3": s3, "hf_check": hf_check}
    source: Source = getattr(module, row.cls)(lanes, *(settings[t] for t in row.takes))
    return source
