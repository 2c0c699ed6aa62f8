"""``<scheme>://<bucket>/<key>`` URLs of object stores, split as written (pure).

A key may hold any character, ``#`` and ``?`` among them (``runs#3/``, ``a?b``).
``urllib.parse`` takes those for a fragment and a query: ``s3://b/dir#x/model.safetensors``
had the path ``/dir``, and a load read the object ``dir``, another file. The AWS CLI
and gcloud take everything after ``<bucket>/`` as the key, as written, without
percent-decoding (``%23`` is three characters of a key): so does this.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["split_bucket_url"]


def split_bucket_url(url: str, scheme: str, example: str) -> tuple[str, str]:
    """``<scheme>://bucket/some/key`` -> ``("bucket", "some/key")``, the key as written
    (leading ``/`` taken off); ``example`` is how the error writes such a URL.

    Raises:
        ConfigError: another scheme, no bucket, or a bucket name holding ``#`` or ``?``
            (no store allows them: a typo, or a key missing its bucket).
    """
    written, sep, rest = url.partition("://")
    if not sep or written.lower() != scheme:
        raise ConfigError(f"{url} does not start with {scheme}://; write {example}")
    bucket, _, key = rest.partition("/")
    if not bucket or "#" in bucket or "?" in bucket:
        raise ConfigError(
            f"{url}: {bucket!r} is not a bucket name (it is empty, or holds '#' or '?'); "
            f"write {example}, where a key may hold '#' and '?' as they are"
        )
    return bucket, key.lstrip("/")
