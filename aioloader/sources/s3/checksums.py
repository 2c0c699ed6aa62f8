"""Which of an S3 object's checksums covers its bytes, and how (pure).

A HEAD in checksum mode answers the checksum an object was uploaded with
(``x-amz-checksum-<algorithm>``, base64). Uploaded in one piece, it is the checksum of
the object's bytes. Uploaded in parts (boto3's ``upload_file`` above 8 MiB) it is, by
default, COMPOSITE: the checksum of the parts' checksums one after the other, which
S3 writes ``<value>-<parts>`` with ``x-amz-checksum-type: COMPOSITE``; a multipart
upload can also ask for a FULL_OBJECT CRC, which covers the bytes as a whole.

Not every store says which: moto's HEAD gives the composite value without its suffix
or type, and only the ETag (``<md5>-<parts>``) tells a multipart object. So:

- ``FULL_OBJECT``, or an object uploaded in one piece (its ETag has no ``-<parts>``),
  and CRC64NVME (S3 has no composite CRC64NVME): the checksum of the whole object;
- ``COMPOSITE`` or a ``-<parts>`` suffix: composite, checked part by part;
- a multipart ETag and nothing else said: either one (both are computed);
- anything that does not add up (an unknown type, a FULL_OBJECT value with a part
  count, part counts that disagree, zero parts): not checked, and ``problem`` says why.

``object_checksums`` hands out only checksums of whole objects (``whole_only``); the
part sizes a composite one needs come from ``HEAD ?partNumber=N`` (s3/source.py), and
``guess_parts`` saves all but the first of those HEADs when the parts are of one size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..digests import computable

__all__ = ["S3Checksum", "guess_parts", "read_checksum", "whole_only"]

# The checksums S3 may publish, cheapest to compute first.
_ORDER = ("crc32c", "crc64nvme", "crc32", "sha1", "sha256")
_MOST_PARTS = 10_000  # S3's limit
_MULTIPART_ETAG = re.compile(r'^(?:W/)?"?[0-9a-fA-F]{32}-(\d+)"?$')


@dataclass(frozen=True)
class S3Checksum:
    """The checksum of an object a load can check, as its HEAD gives it.

    Attributes:
        algorithm: ``"crc32"``, ``"crc32c"``, ``"crc64nvme"``, ``"sha1"`` or ``"sha256"``.
        value: base64, without a ``-<parts>`` suffix.
        header: the header it came in, for messages.
        kind: ``"whole"`` (of the object's bytes), ``"composite"`` (of its parts'
            checksums) or ``"either"`` (a multipart object whose store did not say).
        parts: how many parts the store says the object has (0: not uploaded in parts).
        problem: why it cannot be checked; None when it can.
    """

    algorithm: str
    value: str
    header: str
    kind: str
    parts: int = 0
    problem: str | None = None


def read_checksum(headers: Mapping[str, str]) -> S3Checksum | None:
    """The checksum among a HEAD's headers (lower-case names) this process can compute,
    cheapest first, and how it covers the object; None when there is none."""
    said = headers.get("x-amz-checksum-type", "").strip().upper()
    etag = _MULTIPART_ETAG.match(headers.get("etag", "").strip())
    etag_parts = int(etag.group(1)) if etag else None
    for algorithm in _ORDER:
        header = f"x-amz-checksum-{algorithm}"
        published = headers.get(header, "").strip()
        if not published or not computable(algorithm):
            continue
        value, dash, suffix = published.partition("-")
        if dash and not suffix.isdigit():
            return S3Checksum(algorithm, value, header, "whole", 0, f"{published!r} is no checksum")
        parts = int(suffix) if dash else None
        return _classify(S3Checksum(algorithm, value, header, "whole"), said, parts, etag_parts)
    return None


def _classify(
    found: S3Checksum, said: str, parts: int | None, etag_parts: int | None
) -> S3Checksum:
    def problem(why: str) -> S3Checksum:
        return S3Checksum(found.algorithm, found.value, found.header, found.kind, 0, why)

    if said not in ("", "FULL_OBJECT", "COMPOSITE"):
        return problem(f"x-amz-checksum-type {said!r} is none S3 defines")
    if said == "FULL_OBJECT" or (found.algorithm == "crc64nvme" and parts is None):
        if parts is not None:
            return problem(f"it is said to be FULL_OBJECT but gives a count of {parts} parts")
        return found
    if parts is not None and etag_parts is not None and parts != etag_parts:
        return problem(f"it says {parts} parts, the ETag {etag_parts}")
    count = parts if parts is not None else etag_parts
    if count is None:
        if said == "COMPOSITE":
            return problem("it is said to be COMPOSITE but no part count is given")
        return found  # one piece: the checksum of its bytes
    if not 0 < count <= _MOST_PARTS:
        return problem(f"it is said to have {count} parts")
    kind = "composite" if said == "COMPOSITE" or parts is not None else "either"
    return S3Checksum(found.algorithm, found.value, found.header, kind, count)


def whole_only(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without the checksums that are not of the object's bytes (composite,
    maybe composite, or not to be trusted): what ``object_checksums`` hands out."""
    found = read_checksum(headers)
    keep = found is not None and found.kind == "whole" and found.problem is None
    out = {}
    for name, value in headers.items():
        if name.startswith("x-amz-checksum-") and name != "x-amz-checksum-type":
            if not keep or found is None or name != found.header:
                continue
            value = found.value
        out[name] = value
    return out


def guess_parts(size: int, first: int, count: int) -> tuple[int, ...] | None:
    """The part sizes of a ``size``-byte object in ``count`` parts whose first has
    ``first`` bytes, if all but the last are that size (an SDK's uploads); None when
    they cannot be (the parts must then be asked one by one)."""
    if count < 1 or first < 1:
        return None
    last = size - first * (count - 1)
    if not 0 < last <= first:
        return None
    return (first,) * (count - 1) + (last,)
