"""``aioloader fetch SRC DEST``: copy a model folder to local disk, as a storage initializer.

KServe calls its storage initializer as ``<cmd> SRC DEST``; this is that command's
core. What is copied, and under which names, is folder_files.py's: a folder's files
and its sub-folders' (configs and tokenizers with the weights), or an index's or a
single file's with the well-known files beside them; a presigned URL's one file
under its path's last segment, never its query (DEST's record keeps the URL redacted).

Bytes come through the same sources as a load: concurrent range reads with its
retries, each file pinned to the version it was opened at (ETag, the Hub's commit),
and the whole-object checksum the store publishes checked (S3's
``x-amz-checksum-*``). Everything is written into ``DEST/.aioloader-partial-*`` and
renamed into place only when every file is complete, so no half-written file ever
has a final name; a failed or cancelled copy removes its partial folder, and one
left by a killed copy is removed by the next. Two copies into one DEST take turns
(a lock on the folder). A fetch into a DEST that an earlier fetch filled leaves
exactly the new version there (folder_dest.py: the files fetch wrote are recorded,
and those of the old version are removed; files it did not write stay).

With ``daemon=`` (``aioloader fetch --daemon URL``) the node's daemon downloads the
model into its cache first, and the files it holds are copied from there
(daemon_client.py); the others (config, tokenizer) still come from the origin. A copy
from the daemon is hashed before DEST is committed: it must match the checksum the
daemon's cache recorded and the digest the origin publishes, where it publishes one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, Unpack

from ..cache.checksum import PrefixHash, Published
from ..errors import ConfigError, SourceError
from ..redact import redact, redacting_logger
from ..runtime.tasks import gather
from ..runtime.threads import Lane, run_blocking
from ..settings.options import LoadKeywords, LoadOptions
from ..sources.base import Blob, Source
from ..sources.digests import Digest
from ..sources.stores import Stores, locate
from .daemon_client import DaemonClient, DaemonRecord
from .dest import PARTIAL_PREFIX, RECORD, Destination, dest_error
from .files import WELL_KNOWN, files_to_copy

__all__ = ["PARTIAL_PREFIX", "RECORD", "WELL_KNOWN", "FolderCopy", "copy_folder"]

logger = redacting_logger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class FolderCopy:
    """What ``copy_folder`` did: the files (relative names), their bytes, the time taken."""

    source: str
    dest: str
    files: tuple[str, ...]
    bytes: int
    seconds: float
    daemon: str | None = None  # the daemon the files it held came from
    from_daemon: int = 0  # of ``bytes``, those copied from the daemon's cache

    def summary(self) -> str:
        rate = self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0
        through = ""
        if self.daemon is not None:
            through = f"; {self.from_daemon} of them from the daemon at {self.daemon}"
        return (
            f"fetched {len(self.files)} file{'s' if len(self.files) != 1 else ''} "
            f"({self.bytes} bytes{through}) from {redact(self.source)} into {self.dest} in "
            f"{self.seconds:.2f} s ({rate:.1f} MB/s)"
        )


def _create(path: Path, size: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Read and write: a copy from the daemon is read back to be hashed.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _digest_of(path: Path, published: Published) -> bool:
    running = published.new()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            running.update(memoryview(chunk))
    return published.matches(running)


async def _published(source: Source, url: str) -> Published | None:
    checksums = await source.object_checksums(url)
    for algorithm in ("sha256", "sha1", "crc32"):
        header = f"x-amz-checksum-{algorithm}"
        if header in checksums:
            return Published(algorithm, checksums[header], header)
    return None


def _hash_copy(fd: int, size: int, digest: Digest | None) -> tuple[str, str | None]:
    """The checksum of the file open as ``fd`` in the form cache entries record it, and
    its digest in the form its publisher gives (None without a digest this process can
    compute); one pass over the bytes as written, read back from the page cache."""
    running = digest.running() if digest is not None else None
    feed = None if running is None else (lambda _at, data: running.update(data))
    entry = PrefixHash(observer=feed)
    entry.advance(fd, lambda: size, wait=True)
    return entry.checksum(), running.result() if running is not None else None


def _check_copy(
    daemon: str,
    url: str,
    recorded: str,
    got: str,
    digest: Digest | None,
    published: str | None,
) -> None:
    """Refuse a copy from the daemon whose bytes are not those its cache recorded, or
    not those the origin publishes a digest of (daemon_client.py)."""
    fix = (
        "its cache holds a corrupt copy: run `aioloader cache verify` on that node (it "
        "removes the entry; the daemon downloads it again), then fetch again. Nothing "
        "was written to DEST"
    )
    if got != recorded:
        raise SourceError(
            f"the daemon at {daemon} sent a copy of {redact(url)} whose bytes hash to {got}, "
            f"not the checksum {recorded} its cache recorded when it downloaded them: {fix}"
        )
    if digest is not None and published is not None and published != digest.value:
        raise SourceError(
            f"the daemon at {daemon} sent a copy of {redact(url)} that does not match the "
            f"{digest.algorithm} {digest.where} (it hashes to {published}): {fix}"
        )


class _Copier:
    """Copies files into one partial folder, ``slots`` range reads in flight in all."""

    def __init__(
        self,
        source: Source,
        dest: Destination,
        partial: Path,
        lane: Lane,
        chunk: int,
        slots: int,
        daemon: tuple[DaemonClient, str] | None = None,
    ) -> None:
        self.source = source
        self.daemon = daemon  # the client and the model's id there
        self.dest = dest
        self.partial = partial
        self.lane = lane
        self.chunk = chunk
        self.gate = asyncio.Semaphore(slots)
        self.bytes = 0
        self.from_daemon = 0

    async def _disk(
        self, fn: Callable[[], T], doing: str, on_abandon: Callable[[T], object] | None = None
    ) -> T:
        """Run ``fn`` on the partial folder in a thread; an OSError names DEST."""
        try:
            return await run_blocking(self.lane, fn, on_abandon)
        except OSError as exc:
            raise dest_error(exc, self.dest.path, doing) from None

    async def copy(self, url: str, name: str) -> None:
        blob = await self.source.open(url)
        try:
            path = self.partial / name
            fd = await self._disk(lambda: _create(path, blob.size), f"creating {name}", os.close)
            try:
                if not await self._from_daemon(url, fd, blob, name):
                    await gather(
                        self._range(blob, fd, name, start, min(self.chunk, blob.size - start))
                        for start in range(0, blob.size, self.chunk)
                    )
                    await blob.check_unchanged()
                await self._disk(lambda: os.fsync(fd), f"writing {name}")
            finally:
                os.close(fd)
        finally:
            await blob.aclose()
        published = await _published(self.source, url)
        if published is not None and not await self._disk(
            lambda: _digest_of(path, published), f"reading {name} back"
        ):
            raise SourceError(
                f"{url}: the copied bytes do not match the {published.algorithm} the store "
                f"publishes ({published.where}); they were corrupted on the way: fetch again"
            )
        self.bytes += blob.size

    async def _from_daemon(self, url: str, fd: int, blob: Blob, name: str) -> bool:
        """Copy ``url`` from the daemon's cache, checked (``_check_copy``); False when
        the daemon does not hold this version of it, or cannot vouch for its copy."""
        if self.daemon is None:
            return False
        client, model_id = self.daemon

        async def write(data: memoryview, offset: int) -> None:
            await self._disk(lambda: _pwrite_all(fd, data, offset), f"writing {name}")

        checksum = await client.copy_file(model_id, url, blob.size, blob.etag, write)
        if checksum is None:
            return False
        digest = await self.source.publisher_digest(url)
        got, published = await self._disk(
            lambda: _hash_copy(fd, blob.size, digest), f"reading {name} back"
        )
        _check_copy(client.url, url, checksum, got, digest, published)
        self.from_daemon += blob.size
        return True

    async def _range(self, blob: Blob, fd: int, name: str, start: int, length: int) -> None:
        async with self.gate:
            buffer = memoryview(bytearray(length))
            await blob.read_into(start, [buffer])
            await self._disk(lambda: _pwrite_all(fd, buffer, start), f"writing {name}")


def _check_arguments(src: object, dest: object) -> tuple[str, Path]:
    if not isinstance(src, str) or not src.strip():
        raise ConfigError(f"the source must be a non-empty URL or path, not {src!r}")
    if not isinstance(dest, str | os.PathLike) or not os.fspath(dest):
        raise ConfigError(f"the destination must be a non-empty folder path, not {dest!r}")
    path = Path(os.fspath(dest))
    if path.exists() and not path.is_dir():
        raise ConfigError(f"the destination {path} exists and is not a folder")
    return src, path


def _quiet(record: DaemonRecord) -> None:
    logger.info("the daemon holds the model: %s", record.describe())


async def copy_folder(
    src: str,
    dest: str | os.PathLike[str],
    options: LoadOptions | None = None,
    /,
    *,
    daemon: str | None = None,
    token: str | None = None,
    daemon_wait: float = 600.0,
    progress: Callable[[DaemonRecord], None] = _quiet,
    **keywords: Unpack[LoadKeywords],
) -> FolderCopy:
    """Copy the model folder at ``src`` into the local folder ``dest`` (see the module).

    Args:
        src: a folder, index or ``.safetensors`` URL (any scheme a load reads).
        dest: the local folder; made if missing. A file already there under the name
            of a file copied is replaced; the files an earlier fetch into ``dest`` wrote
            that this one does not are removed (folder_dest.py); others stay.
        options, keywords: what a load takes; concurrency, chunk_size, memory_limit
            (reads in flight hold at most this many bytes), the http and s3 settings.
        daemon: the node daemon's URL (``http://HOST:PORT``): it fetches the model and
            the files it holds are copied from it (daemon_client.py); ``token`` is its
            bearer token, ``daemon_wait`` the seconds its download may stand still,
            ``progress`` called with its record as that moves. A local ``src`` is
            copied directly: the daemon holds remote models only.

    Raises:
        ConfigError: a bad argument or option.
        SourceError: the source could not be listed or read, a file changed mid-copy
            or does not match its published checksum; ``dest`` is left as it was.
        CacheError: ``dest`` cannot be written (not writable, full, a link in the way);
            what this fetch wrote was removed.
    """
    src, path = _check_arguments(src, dest)
    built = LoadOptions.build(options, **keywords)
    limits = built.limits
    assert limits is not None
    started = time.perf_counter()
    where = locate(src)
    # The copy reads the store itself (or the daemon's copy): no node cache around it.
    async with contextlib.AsyncExitStack() as exits:
        held = None
        if daemon is not None and where.scheme.remote:
            client = await exits.enter_async_context(DaemonClient(daemon, token, daemon_wait))
            held = client, (await client.ready(src, progress)).id
        elif daemon is not None:
            logger.info("%s is local: copied directly, not through the daemon", src)
        stack = await exits.enter_async_context(Stores(built))
        source = stack.source(where)
        copies = await files_to_copy(source, src)
        lane = stack.lanes.cache
        target = await run_blocking(lane, lambda: Destination.open(path), Destination.close)
        try:
            partial = await run_blocking(lane, target.new_partial)
            try:
                slots = max(1, min(limits.concurrency, limits.staging_bytes // limits.chunk_size))
                copier = _Copier(source, target, partial, lane, limits.chunk_size, slots, held)
                await gather(copier.copy(url, name) for url, name in copies)
                names = [name for _, name in copies]
                strangers = await run_blocking(lane, lambda: target.commit(partial, names, src))
            finally:
                await run_blocking(lane, lambda: shutil.rmtree(partial, ignore_errors=True))
        finally:
            target.close()
    for name in strangers:
        logger.warning(
            "%s: %s was not written by aioloader fetch and stays; a load of the folder may "
            "read it with the files fetched: remove it, or fetch into an empty folder",
            path, name,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    through = held[0].url if held is not None else None
    return FolderCopy(
        src, str(path), tuple(names), copier.bytes, seconds, through, copier.from_daemon
    )
