"""S3 URLs: ``s3://bucket/key`` and where a bucket or object is at the endpoint."""

from __future__ import annotations

from urllib.parse import quote, urlparse

from ...errors import ConfigError

__all__ = ["bucket_url", "object_url", "split_s3_url"]


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ConfigError(f"{url} is not an S3 URL; write s3://bucket/key")
    return parsed.netloc, parsed.path.lstrip("/")


def bucket_url(endpoint: str, bucket: str, *, path_style: bool) -> str:
    """The bucket's URL at ``endpoint``, path-style or virtual-hosted (a bucket name
    with dots cannot be a host name under a wildcard certificate: path-style then)."""
    if path_style or "." in bucket:
        return f"{endpoint}/{bucket}"
    scheme, _, host = endpoint.partition("://")
    return f"{scheme}://{bucket}.{host}"


def object_url(endpoint: str, url: str, *, path_style: bool) -> str:
    """The URL of the object ``s3://bucket/key`` at ``endpoint``, its key percent-encoded."""
    bucket, key = split_s3_url(url)
    return f"{bucket_url(endpoint, bucket, path_style=path_style)}/{quote(key, safe='/~')}"
