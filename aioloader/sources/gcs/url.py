"""GCS URLs: ``gs://bucket/object`` and the JSON API's URLs for it."""

from __future__ import annotations

from urllib.parse import quote, urlparse

from ...errors import ConfigError

__all__ = ["ENDPOINT", "api_url", "split_gs_url"]

ENDPOINT = "https://storage.googleapis.com"


def split_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/some/object`` -> ``("bucket", "some/object")``."""
    parsed = urlparse(url)
    if parsed.scheme != "gs" or not parsed.netloc:
        raise ConfigError(f"{url} is not a Google Cloud Storage URL; write gs://bucket/object")
    return parsed.netloc, parsed.path.lstrip("/")


def api_url(endpoint: str, bucket: str, key: str = "", *, download: bool = False) -> str:
    """The JSON API's URL of ``bucket``'s objects, or of the object ``key`` (its media
    download with ``download``)."""
    base = f"{endpoint}{'/download' if download else ''}/storage/v1/b/"
    url = base + quote(bucket, safe="") + "/o"
    return url + ("/" + quote(key, safe="") if key else "")
