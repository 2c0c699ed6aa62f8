"""The digest a publisher gives for a whole file, and a running hash in its form (pure).

Two publishers give one:

- The Hugging Face Hub lists every file of a commit with the id of its blob: the
  LFS oid of a weight file (the sha256 of its bytes), the git blob id of a regular
  one (the sha1 of ``blob <size>\\0`` and its bytes), both in hex.
- S3 answers a HEAD in checksum mode with the checksum an object was uploaded with
  (``x-amz-checksum-sha256``, ``-sha1``, ``-crc32``, ``-crc32c``, ``-crc64nvme``,
  base64 of the big-endian digest). It covers the whole object when its type
  (``x-amz-checksum-type``) is ``FULL_OBJECT``: every single-part upload, and a
  multipart upload with a full-object CRC. A ``COMPOSITE`` one (``<digest>-<parts>``)
  is a digest of the parts' digests, which a reader of ranges cannot check.

CRC32C needs ``google-crc32c`` and CRC64NVME ``awscrt``; an object that publishes
only a checksum this process cannot compute is read unchecked (logged at DEBUG).
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Digest", "Running", "hub_digest", "s3_digest"]

_BLOCK = 1 << 20
# The checksums S3 may publish, cheapest to compute first.
_S3_ORDER = ("crc32c", "crc64nvme", "crc32", "sha1", "sha256")


@dataclass(frozen=True)
class Digest:
    """A digest of a whole file, as its publisher gives it.

    Attributes:
        algorithm: ``"sha256"``, ``"sha1"``, ``"crc32"``, ``"crc32c"`` or ``"crc64nvme"``.
        value: the digest as published (lower-case hex, or base64).
        encoding: ``"hex"`` or ``"base64"``.
        where: who publishes it, for messages: "the <algorithm> <where>" reads as a
            phrase ("the sha256 the Hub publishes for ... (its LFS oid)").
        prefix: bytes hashed before the file's (git's ``blob <size>\\0``).
    """

    algorithm: str
    value: str
    encoding: str
    where: str
    prefix: bytes = b""

    def running(self) -> Running | None:
        """A hash to feed the file's bytes into; None when this process cannot compute
        this algorithm (a CRC whose library is not installed)."""
        update = _updater(self.algorithm)
        if update is None:
            return None
        running = Running(self, update)
        if self.prefix:
            running.update(memoryview(self.prefix))
        return running


class Running:
    """A digest being computed, fed in order; ``result()`` in the publisher's form.

    Not thread-safe: one thread feeds it at a time (hashlib and the CRC libraries
    release the GIL on large updates).
    """

    def __init__(self, digest: Digest, update: tuple[Any, Callable[[Any, memoryview], Any]]):
        self.digest = digest
        self._state, self._step = update

    def update(self, data: memoryview) -> None:
        self._state = self._step(self._state, data)

    def result(self) -> str:
        state = self._state
        if isinstance(state, int):
            width = 8 if self.digest.algorithm == "crc64nvme" else 4
            raw = state.to_bytes(width, "big")
        else:
            raw = state.digest()
        if self.digest.encoding == "hex":
            return raw.hex()
        return base64.b64encode(raw).decode()


def _hashlib_step(state: Any, data: memoryview) -> Any:
    state.update(data)
    return state


def _updater(algorithm: str) -> tuple[Any, Callable[[Any, memoryview], Any]] | None:
    """The initial state and the step of ``algorithm``; None when it is not available."""
    if algorithm in ("sha256", "sha1"):
        return hashlib.new(algorithm, usedforsecurity=False), _hashlib_step
    if algorithm == "crc32":
        return 0, lambda crc, data: zlib.crc32(data, crc)
    if algorithm == "crc32c":
        try:
            import google_crc32c
        except ImportError:
            return None

        def crc32c(crc: int, data: memoryview) -> int:
            # Its C extension takes bytes only: a megabyte at a time.
            for start in range(0, data.nbytes, _BLOCK):
                crc = google_crc32c.extend(crc, bytes(data[start : start + _BLOCK]))
            return crc

        return 0, crc32c
    if algorithm == "crc64nvme":
        try:
            from awscrt import checksums
        except ImportError:
            return None
        return 0, lambda crc, data: checksums.crc64nvme(data, crc)
    return None


def hub_digest(blob_id: str, size: int, where: str) -> Digest | None:
    """The digest a Hub listing's blob id stands for: an LFS sha256 (64 hex digits) or
    a git blob sha1 (40); None for anything else (an id the listing did not give)."""
    blob_id = blob_id.lower()
    if len(blob_id) == 64 and _is_hex(blob_id):
        return Digest("sha256", blob_id, "hex", f"the Hub publishes for {where} (its LFS oid)")
    if len(blob_id) == 40 and _is_hex(blob_id):
        prefix = b"blob %d\0" % size
        where = f"the Hub publishes for {where} (its git blob id)"
        return Digest("sha1", blob_id, "hex", where, prefix)
    return None


def s3_digest(checksums: Mapping[str, str]) -> Digest | None:
    """The full-object checksum among S3's ``x-amz-checksum-*`` headers (lower-case
    names) that this process can compute, cheapest first; None when there is none."""
    kind = checksums.get("x-amz-checksum-type", "FULL_OBJECT").upper()
    if kind != "FULL_OBJECT":
        return None
    for algorithm in _S3_ORDER:
        header = f"x-amz-checksum-{algorithm}"
        value = checksums.get(header)
        if value and "-" not in value:
            digest = Digest(algorithm, value.strip(), "base64", f"S3 publishes ({header})")
            if _updater(algorithm) is not None:
                return digest
    return None


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
