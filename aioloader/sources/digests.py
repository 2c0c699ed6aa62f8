"""The digest a publisher gives for a whole file, and a running hash in its form (pure).

Three publishers give one:

- The Hugging Face Hub lists every file of a commit with the id of its blob: the
  LFS oid of a weight file (the sha256 of its bytes), the git blob id of a regular
  one (the sha1 of ``blob <size>\\0`` and its bytes), both in hex.
- S3 answers a HEAD in checksum mode with the checksum an object was uploaded with
  (``x-amz-checksum-sha256``, ``-sha1``, ``-crc32``, ``-crc32c``, ``-crc64nvme``,
  base64 of the big-endian digest). It covers the whole object when its type
  (``x-amz-checksum-type``) is ``FULL_OBJECT``: every single-part upload, and a
  multipart upload with a full-object CRC. A ``COMPOSITE`` one (``<digest>-<parts>``)
  is the digest of the parts' digests, one after the other: a ``Digest`` with the
  sizes of the parts (``parts``) hashes each part's byte range on its own, then
  those digests (s3/checksums.py says which is which).

- Cloud Storage gives every object a ``crc32c`` (base64 of the big-endian CRC), and
  one uploaded in one piece an ``md5Hash`` too; a composed object has none (its MD5
  is unknown to the store): the crc32c is checked, the MD5 only where it is the only one.

CRC32C needs ``google-crc32c`` and CRC64NVME ``awscrt``; an object that publishes
only a checksum this process cannot compute is read unchecked (logged at DEBUG).
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Digest", "Running", "computable", "gcs_digest", "hub_digest", "s3_digest"]

_BLOCK = 1 << 20
# The checksums S3 may publish, cheapest to compute first.
_S3_ORDER = ("crc32c", "crc64nvme", "crc32", "sha1", "sha256")


@dataclass(frozen=True)
class Digest:
    """A digest of a whole file, as its publisher gives it.

    Attributes:
        algorithm: ``"sha256"``, ``"sha1"``, ``"md5"``, ``"crc32"``, ``"crc32c"`` or
            ``"crc64nvme"``.
        value: the digest as published (lower-case hex, or base64).
        encoding: ``"hex"`` or ``"base64"``.
        where: who publishes it, for messages: "the <algorithm> <where>" reads as a
            phrase ("the sha256 the Hub publishes for ... (its LFS oid)").
        prefix: bytes hashed before the file's (git's ``blob <size>\\0``).
        parts: the sizes of the parts of a composite digest, in order (their sum is
            the file's size); empty: a digest of the whole file.
        whole_too: a composite digest that may also be one of the whole file (the
            publisher did not say which): either reading matches.
        confirm: awaited before a mismatch is told; False: ``parts`` was a guess that
            turned out wrong, and the file is left unchecked (said at WARNING).
    """

    algorithm: str
    value: str
    encoding: str
    where: str
    prefix: bytes = b""
    parts: tuple[int, ...] = ()
    whole_too: bool = False
    confirm: Callable[[], Awaitable[bool]] | None = field(default=None, compare=False)

    def running(self) -> Running | None:
        """A hash to feed the file's bytes into; None when this process cannot compute
        this algorithm (a CRC whose library is not installed)."""
        update = _updater(self.algorithm)
        if update is None:
            return None
        running: Running = Running(self, update) if not self.parts else _PartWise(self, update)
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
        return self._encode(_raw(self.digest.algorithm, self._state))

    def _encode(self, raw: bytes) -> str:
        if self.digest.encoding == "hex":
            return raw.hex()
        return base64.b64encode(raw).decode()


class _PartWise(Running):
    """A composite digest: each part's bytes hashed on their own, then the parts' digests
    back to back (and, with ``whole_too``, every byte in one hash besides)."""

    def __init__(self, digest: Digest, update: tuple[Any, Callable[[Any, memoryview], Any]]):
        super().__init__(digest, update)
        self._sizes = list(reversed(digest.parts))  # the parts still to come, next last
        self._left = self._sizes.pop()  # bytes the current part still takes
        self._part: Any = _updater(digest.algorithm)[0]  # type: ignore[index]
        self._done = bytearray()  # the finished parts' digests
        self._open = True  # a part is being hashed (False: past the last one)

    def update(self, data: memoryview) -> None:
        if self.digest.whole_too:
            super().update(data)
        while data.nbytes and self._open:  # bytes past the last part: no match
            take = min(self._left, data.nbytes)
            self._part = self._step(self._part, data[:take])
            data, self._left = data[take:], self._left - take
            self._finish_parts()
        if data.nbytes:
            self._done += b"\0"  # more bytes than the parts hold: matches nothing

    def _finish_parts(self) -> None:
        """Close the parts that have all their bytes (an empty one at once)."""
        while self._open and self._left == 0:
            self._done += _raw(self.digest.algorithm, self._part)
            self._open = bool(self._sizes)
            if self._open:
                self._part = _updater(self.digest.algorithm)[0]  # type: ignore[index]
                self._left = self._sizes.pop()

    def result(self) -> str:
        if self.digest.whole_too and super().result() == self.digest.value:
            return self.digest.value
        self._finish_parts()
        state, step = _updater(self.digest.algorithm)  # type: ignore[misc]
        return self._encode(_raw(self.digest.algorithm, step(state, memoryview(self._done))))


def _raw(algorithm: str, state: Any) -> bytes:
    """The digest in ``state``: a CRC's big-endian bytes, or a hashlib digest."""
    if isinstance(state, int):
        return state.to_bytes(8 if algorithm == "crc64nvme" else 4, "big")
    return bytes(state.digest())


def _hashlib_step(state: Any, data: memoryview) -> Any:
    state.update(data)
    return state


def _updater(algorithm: str) -> tuple[Any, Callable[[Any, memoryview], Any]] | None:
    """The initial state and the step of ``algorithm``; None when it is not available."""
    if algorithm in ("sha256", "sha1", "md5"):
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


def computable(algorithm: str) -> bool:
    """Whether this process can compute ``algorithm`` (the CRC libraries are optional)."""
    return _updater(algorithm) is not None


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
    names) that this process can compute, cheapest first; None when there is none.
    ``checksums`` is what ``S3Source.object_checksums`` hands out: the checksums of
    the object's bytes alone (s3/checksums.py leaves out the composite ones)."""
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


def gcs_digest(metadata: Mapping[str, Any], where: str) -> Digest | None:
    """The checksum to check a Cloud Storage object against, from its metadata: its
    ``crc32c`` (every object has one) where this process can compute it, else its
    ``md5Hash`` (not given for a composed object); None when neither is usable."""
    for algorithm, name in (("crc32c", "crc32c"), ("md5", "md5Hash")):
        value = metadata.get(name)
        if isinstance(value, str) and value.strip() and computable(algorithm):
            return Digest(algorithm, value.strip(), "base64", f"{where} publishes ({name})")
    return None


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
