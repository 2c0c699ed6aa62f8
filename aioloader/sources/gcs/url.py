"""GCS URLs: ``gs://bucket/object`` and the JSON API's URLs for it."""

from __future__ import annotations

from urllib.parse import quote

from ..bucket_url import split_bucket_url

__all__ = ["ENDPOINT", "api_url", "split_gs_url"]

ENDPOINT = "https://storage.googleapis.com"


def split_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/some/object`` -> ``("bucket", "some/object")``: the name as written,
    ``#`` and ``?`` included (bucket_url.py).

    Raises:
        ConfigError: not a ``gs://`` URL, or no bucket name in it.
    """
    return split_bucket_url(url, "gs", "gs://bucket/object")


def api_url(endpoint: str, bucket: str, key: str = "", *, download: bool = False) -> str:
    """The JSON API's URL of ``bucket``'s objects, or of the object ``key`` (its media
    download with ``download``)."""
    base = f"{endpoint}{'/download' if download else ''}/storage/v1/b/"
    url = base + quote(bucket, safe="") + "/o"
    return url + ("/" + quote(key, safe="") if key else "")
