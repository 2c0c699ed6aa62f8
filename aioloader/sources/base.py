"""The interface every storage backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Blob", "Source", "aclose_all", "clip"]


class Blob(ABC):
    """One open file or object, read by byte range.

    Attributes:
        url: where it lives, as shown to users.
        size: its length in bytes, fixed when it was opened.
    """

    url: str
    size: int

    @abstractmethod
    async def read_bytes(self, offset: int, length: int) -> bytes:
        """Read a small range (headers, index files) into a new ``bytes``."""

    @abstractmethod
    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` back to back with the bytes starting at ``offset``.

        The hot path: bytes land in the caller's memory without an intermediate
        copy. Either every buffer is filled or an error is raised.
        """

    async def check_unchanged(self) -> None:  # noqa: B027 - optional hook
        """Raise ``ObjectChangedError`` if the file is no longer the version that was
        opened; called after its last read. Here: nothing to check."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release the handle; idempotent."""


class Source(ABC):
    """A kind of storage that can list folders and open files."""

    #: Whether an ETag of 32 hex digits is the MD5 of the object's bytes, as S3 makes it
    #: for a single-part upload (not under SSE-KMS or SSE-C: ``object_checksums`` says).
    #: Anywhere else an ETag is opaque, whatever it looks like.
    etag_is_md5: bool = False

    @abstractmethod
    async def list_dir(self, url: str) -> list[str] | None:
        """Names in the folder at ``url``, sorted, each sub-folder's with a trailing ``/``;
        ``None`` when ``url`` is not a folder."""

    @abstractmethod
    async def open(self, url: str) -> Blob:
        """Open the file at ``url`` for range reads."""

    async def read_file(self, url: str) -> bytes:
        """The whole small file at ``url`` (an index): opened, read and closed here; a
        local source reads it with aiofiles instead (small_files.py)."""
        blob = await self.open(url)
        try:
            return await blob.read_bytes(0, blob.size)
        finally:
            await blob.aclose()

    async def object_checksums(self, url: str) -> dict[str, str]:
        """Digests of the whole object the storage publishes (header name -> value),
        e.g. S3's ``x-amz-checksum-sha256``, and the headers that say whether its ETag
        is a digest (S3's ``x-amz-server-side-encryption``); empty where it has none."""
        return {}

    def join(self, base: str, name: str) -> str:
        """The URL of ``name`` inside the folder ``base`` (here: ``/``-separated URLs)."""
        return base.rstrip("/") + "/" + name

    def parent(self, url: str) -> str:
        """The folder holding ``url`` (here: ``/``-separated URLs)."""
        return url.rsplit("/", 1)[0]

    def statistics(self) -> Any:
        """Request statistics of a remote store (a snapshot); None where it keeps none."""
        return None

    @abstractmethod
    async def aclose(self) -> None:
        """Release pools and threads; idempotent."""


async def aclose_all(blobs: Iterable[Blob]) -> None:
    """Close every blob, even when closing one fails or is cancelled; re-raise the first.

    A loop of plain ``await blob.aclose()`` stops at the first cancellation and
    leaves the rest open, with their locks and files.
    """
    first: BaseException | None = None
    for blob in blobs:
        try:
            await blob.aclose()
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first


def clip(buffers: Sequence[memoryview], limit: int) -> list[memoryview]:
    """The buffers as bytes, cut to ``limit`` bytes: plans may reach past the end of a file."""
    out = []
    for buffer in buffers:
        if limit <= 0:
            break
        view = buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
        out.append(view[:limit])
        limit -= view.nbytes
    return out
