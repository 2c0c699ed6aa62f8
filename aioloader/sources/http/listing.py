"""Listing a remote store's folder by prefix: the parts S3, GCS and Azure share.

Each store pages through its own listing API; here is what they agree on: which
keys name a folder, what an empty answer means, and the error for a page that is
not the store's own document.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ...errors import SourceError

__all__ = ["broken_listing", "listed", "prefix_to_list", "xml_listing"]


def prefix_to_list(key: str) -> str | None:
    """The listing prefix for an object key that may name a folder; None for a file's key."""
    if key.endswith((".safetensors", ".json")):
        return None
    return key if key.endswith("/") or key == "" else key + "/"


def listed(names: list[str], key: str) -> list[str] | None:
    """A listing's answer to ``list_dir``: None when ``key`` was no prefix after all (so
    that opening it says whether the object exists)."""
    if not names and key and not key.endswith("/"):
        return None
    return sorted(set(names))  # a folder marker object and its prefix name one folder


def broken_listing(url: str, endpoint: str, problem: str) -> SourceError:
    """The error for a listing page that is not the store's: what is wrong, and where."""
    return SourceError(
        f"{url}: the listing that {endpoint} sent is not a storage listing: {problem}; check "
        "that the endpoint is the object store (a proxy or login page may answer instead)"
    )


def xml_listing(url: str, endpoint: str, body: bytes, root: str) -> ET.Element:
    """A listing page parsed as XML whose root element is ``root`` (any namespace).

    Raises:
        SourceError: it is not XML, or not such a document.
    """
    try:
        document = ET.fromstring(body)
    except ET.ParseError as exc:
        raise broken_listing(url, endpoint, f"it is not XML ({exc})") from None
    if document.tag.rpartition("}")[2] != root:
        tag = document.tag.rpartition("}")[2][:50]
        raise broken_listing(url, endpoint, f"its root element is <{tag}>, not <{root}>")
    return document
