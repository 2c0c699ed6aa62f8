"""S3 URLs: ``s3://bucket/key`` and where a bucket or object is at the endpoint."""

from __future__ import annotations

from urllib.parse import quote

from ..bucket_url import split_bucket_url

__all__ = ["bucket_url", "object_url", "split_s3_url"]


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``: the key as written, ``#``
    and ``?`` included, as the AWS CLI takes it (bucket_url.py).

    Raises:
        ConfigError: not an ``s3://`` URL, or no bucket name in it.
    """
    return split_bucket_url(url, "s3", "s3://bucket/key")


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
