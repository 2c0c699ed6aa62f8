"""Checksums of cache entries (sync; run in threads).

Every entry records the xxh3-128 of its bytes in ``meta.json`` when it completes;
``ModelCache.verify`` hashes the file again and compares. Where the server
publishes a digest of the whole object (an S3 ETag that is an MD5, as S3 sends for
a single-part upload: 32 hex digits; or S3's ``x-amz-checksum-sha256``, ``-sha1`` or
``-crc32`` of an object uploaded with a checksum), a fetch also checks the download
against it. A plain HTTP server's ETag is opaque, whatever it looks like
(``Source.etag_is_md5``).

A fetch hashes as it downloads instead of re-reading the file at the end: each
write may extend the prefix of the file that is present, and the thread that
wrote it hashes that prefix further, reading back bytes it just wrote (from the
page cache). Only what is still unhashed when the entry completes is read then.
A load through the cache writes with ``O_DIRECT`` and hashes the whole file when
it commits the entry, after the load has returned (partial.py, commit.py).
Measured on one core (AMD EPYC, page cache): xxh3-128 about 11 GiB/s, so
~0.1 s of CPU per GiB, mostly hidden behind the network; MD5 about 0.6 GiB/s
(~1.7 s per GiB), which is why only ``fetch`` (the daemon's path) computes it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import xxhash

__all__ = [
    "ALGORITHM", "DigestMismatch", "PrefixHash", "Published", "Stopped", "hash_file",
    "md5_of_etag",
]  # fmt: skip

ALGORITHM = "xxh3-128"
_BLOCK = 1 << 20  # short enough that a hashing thread holds the GIL only briefly
_MD5_ETAG = re.compile(r'"?([0-9a-fA-F]{32})"?')


@dataclass(frozen=True)
class Published:
    """A digest of the whole object, as the server published it.

    Attributes:
        algorithm: ``"md5"`` (hex, from an ETag), ``"sha256"``, ``"sha1"`` or ``"crc32"``
            (base64 of the digest, from S3's ``x-amz-checksum-*``).
        value: the digest as published.
        where: where it was published, for messages (``"ETag"``, a header name).
    """

    algorithm: str
    value: str
    where: str

    def new(self) -> _Running:
        return _Running(self.algorithm)

    def matches(self, running: _Running) -> bool:
        return running.published_form() == self.value


class _Running:
    """One running digest in the form the server publishes it."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._crc = 0
        self._hash: Any = None if algorithm == "crc32" else hashlib.new(algorithm)

    def update(self, data: memoryview) -> None:
        if self._hash is None:
            self._crc = zlib.crc32(data, self._crc)
        else:
            self._hash.update(data)

    def published_form(self) -> str:
        if self.algorithm == "md5":
            return str(self._hash.hexdigest())
        raw = self._crc.to_bytes(4, "big") if self._hash is None else self._hash.digest()
        return base64.b64encode(raw).decode()


class DigestMismatch(Exception):
    """The bytes written do not hash to what the server published."""

    def __init__(self, published: Published, actual: str) -> None:
        super().__init__(f"{published.algorithm} {actual}, published {published.value}")
        self.published = published
        self.actual = actual


def md5_of_etag(etag: str | None) -> Published | None:
    """The MD5 an S3 ETag publishes: 32 hex digits, as S3 sends for a single-part upload.

    Multipart ETags (``"<hex>-<parts>"``) and every other form publish none. Only for a
    source whose ETags are MD5s (``Source.etag_is_md5``): elsewhere 32 hex digits may be
    anything.
    """
    match = _MD5_ETAG.fullmatch(etag) if etag else None
    return Published("md5", match.group(1).lower(), "ETag") if match else None


class Stopped(Exception):
    """Hashing was asked to stop (its caller was cancelled)."""


class PrefixHash:
    """The hashes of a file's bytes, fed in order as its prefix becomes present.

    Thread-safe: several writer threads call ``advance``; one hashes at a time and
    the others return at once, leaving the rest to it or to the next call.

    Args:
        published: also compute the digest the server published (MD5 and SHA are
            slow: see the module docstring).
        observer: also given each block read, with its position in the file.
    """

    def __init__(
        self,
        *,
        published: Published | None = None,
        observer: Callable[[int, memoryview], None] | None = None,
    ) -> None:
        self._xxh = xxhash.xxh3_128()
        self._published = published.new() if published is not None else None
        self._observer = observer
        self.position = 0
        self._lock = threading.Lock()
        self._buffer: memoryview | None = None  # used under _lock

    def advance(
        self,
        fd: int,
        present: Callable[[], int],
        *,
        wait: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        """Hash ``fd`` on from where it stopped, up to ``present()`` bytes (re-read as it goes).

        Args:
            wait: wait for another thread hashing now instead of returning.
            stop: when set, raise ``Stopped`` between blocks.

        Raises:
            OSError: reading ``fd`` failed.
        """
        if not self._lock.acquire(blocking=wait):
            return
        try:
            while (end := present()) > self.position:
                if stop is not None and stop.is_set():
                    raise Stopped
                if self._buffer is None:
                    self._buffer = memoryview(bytearray(_BLOCK))
                buffer = self._buffer
                n = os.preadv(fd, [buffer[: min(_BLOCK, end - self.position)]], self.position)
                if n == 0:
                    raise EOFError(f"file ended at byte {self.position} of {end}")
                self._xxh.update(buffer[:n])
                if self._published is not None:
                    self._published.update(buffer[:n])
                if self._observer is not None:
                    self._observer(self.position, buffer[:n])
                self.position += n
        finally:
            self._lock.release()

    def checksum(self) -> str:
        """``xxh3-128:<hex>`` of the bytes hashed so far."""
        return f"{ALGORITHM}:{self._xxh.hexdigest()}"

    def published_form(self) -> str | None:
        """The second digest, in the form the server published its own."""
        return self._published.published_form() if self._published is not None else None


def hash_file(path: str | os.PathLike[str], stop: threading.Event | None = None) -> str:
    """The checksum of a whole file, as entries record it (a link is not followed).

    Raises:
        OSError: the file cannot be read.
        Stopped: ``stop`` was set.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        digest = PrefixHash()
        digest.advance(fd, lambda: size, wait=True, stop=stop)
        return digest.checksum()
    finally:
        os.close(fd)
