"""Pick the storage backend for a URL."""

from __future__ import annotations

from urllib.parse import urlparse

from ..errors import ConfigError
from .base import Source

__all__ = ["scheme_of", "source_for"]


def scheme_of(url: str) -> str:
    """``file`` for paths and file:// URLs, else the lower-cased URL scheme."""
    scheme = urlparse(url).scheme.lower()
    # A one-letter scheme is a Windows drive ("C:\\..."), not a URL.
    return "file" if len(scheme) <= 1 else scheme


def source_for(url: str, *, concurrency: int) -> Source:
    """A new Source able to read ``url``.

    Raises:
        ConfigError: no backend reads this kind of URL.
    """
    scheme = scheme_of(url)
    if scheme == "file":
        from .file import FileSource

        return FileSource(threads=concurrency)
    raise ConfigError(
        f"{url}: URL scheme {scheme!r} is not supported by this version of aioloader; "
        "it reads local paths and file:// URLs"
    )
