"""The interface every storage backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from .digests import Digest

__all__ = [
    "Blob",
    "CacheOutcome",
    "Current",
    "ForwardingBlob",
    "Source",
    "aclose_all",
    "clip",
]

#: What a cache did for one file of a load: read it from the cache, or filled the cache.
CacheOutcome = Literal["hit", "miss"]


class Blob(ABC):
    """One open file or object, read by byte range.

    Attributes:
        url: where it lives, as shown to users.
        size: its length in bytes, fixed when it was opened.
        etag: the version's ETag the storage reported when it was opened (or the
            equivalent: a GCS generation), None where it reports none.
        last_modified: its ``Last-Modified`` when opened, None where it reports none.

    ``size``, ``etag`` and ``last_modified`` are the version that was opened: the ranks
    of a group compare them, the node cache keys its entries with them.
    """

    url: str
    size: int
    etag: str | None = None
    last_modified: str | None = None

    @property
    def cache_outcome(self) -> CacheOutcome | None:
        """What a cache did for this file (report.py): ``"hit"``, ``"miss"``, or None
        when it was not read through a cache."""
        return None

    @property
    def checked(self) -> str | None:
        """The publisher's digest that every byte of the file was hashed against and
        matched (sources/verifying.py), once it did; None: not checked, or not yet."""
        return None

    def received(self, offset: int, buffers: Sequence[memoryview]) -> None:  # noqa: B027
        """Bytes of this file that reached the caller another way (another rank of a
        ``group=`` load sent them), offered as if read here: a cache keeps them. Here:
        nothing to do. Blocking, called from the exchange's thread: never on the loop."""

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


class ForwardingBlob(Blob):
    """A blob that wraps another: everything goes to ``inner`` unless overridden.

    A wrapper (a digest check, a cache filling as reads arrive) overrides what it adds
    to; the version, the cache outcome, ``received``, ``check_unchanged`` and the reads
    it leaves alone are the inner blob's. ``aclose`` closes ``inner``.
    """

    def __init__(self, inner: Blob) -> None:
        self.inner = inner
        self.url = inner.url
        self.size = inner.size
        self.etag = inner.etag
        self.last_modified = inner.last_modified

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.inner!r}>"

    @property
    def cache_outcome(self) -> CacheOutcome | None:
        return self.inner.cache_outcome

    @property
    def checked(self) -> str | None:
        return self.inner.checked

    def received(self, offset: int, buffers: Sequence[memoryview]) -> None:
        self.inner.received(offset, buffers)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        return await self.inner.read_bytes(offset, length)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self.inner.read_into(offset, buffers)

    async def check_unchanged(self) -> None:
        await self.inner.check_unchanged()

    async def aclose(self) -> None:
        await self.inner.aclose()


class Current(NamedTuple):
    """A file's size and validators as its store has it now (``Source.current``)."""

    size: int
    etag: str | None
    last_modified: str | None


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

    async def current(self, url: str) -> Current:
        """The size and validators of the file at ``url`` as the store has it now, to
        tell whether a copy that came another way (a peer's, swarm/supply.py) is of
        this version. Here: the file is opened and closed (a store that can answer
        without sending bytes, with a HEAD, says so itself)."""
        blob = await self.open(url)
        try:
            return Current(blob.size, blob.etag, blob.last_modified)
        finally:
            await blob.aclose()

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

    async def publisher_digest(self, url: str) -> Digest | None:
        """The digest of the whole file its publisher gives, to check a copy of it that
        came another way (the swarm, swarm/supply.py); None where there is none.

        Here: S3's full-object checksum among ``object_checksums`` (a HEAD, no body),
        where the store answers one; a source whose listing gives one (the Hub's LFS
        sha256) says so itself."""
        checksums = await self.object_checksums(url)
        if not checksums:
            return None
        from .digests import s3_digest

        return s3_digest(checksums)

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
