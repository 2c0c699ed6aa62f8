"""One cache entry on disk: its files, metadata and range journal (sync; run in threads).

An entry is the folder ``<root>/entries/<sha256 of the URL>/``::

    meta.json       {url, size, etag, last_modified, complete, created, last_used, boot_id,
                    checksum}: checksum is "xxh3-128:<hex>" of data, once complete
    data            the file's bytes, present only once complete
    data.partial    the bytes being downloaded, preallocated to the full size
    data.ranges     journal of the byte ranges of data.partial already written
    lock            flock(LOCK_EX) by the one process downloading the entry
    use             flock(LOCK_SH) by every reader; eviction needs LOCK_EX

``lock`` and ``use`` are never deleted: a process waiting on a lock file that
another one unlinked would hold a lock nobody else can see. Nothing below the
cache folder is a symbolic link (see paths.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import CacheError
from .checksum import DigestMismatch, PrefixHash, Published
from .paths import check_dirs, make_dirs, open_file
from .ranges import RangeSet

__all__ = [
    "EntryFiles",
    "Meta",
    "PartialFile",
    "Version",
    "cache_error",
    "clip",
    "key_of",
    "no_room",
    "read_meta",
    "regular_size",
    "write_meta",
]


def key_of(url: str) -> str:
    """The entry's folder name: the SHA-256 of the URL."""
    return hashlib.sha256(url.encode()).hexdigest()


def _boot_id() -> str | None:
    # Bytes written but never fsynced die with the machine, not with the process:
    # a journal written before a reboot cannot be trusted.
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


BOOT_ID = _boot_id()


# Errors that mean "this cache cannot take these bytes": a load then goes on without it.
_NO_ROOM = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
)


def no_room(exc: OSError) -> bool:
    """Whether ``exc`` says the cache is full, read-only or not ours to write."""
    return exc.errno in _NO_ROOM


def cache_error(exc: OSError, root: Path | str, doing: str) -> CacheError:
    """A CacheError for an OSError met while ``doing`` something in the cache at ``root``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        hint = (
            "it is full: free space there, lower max_bytes, or point AIOLOADER_CACHE_DIR "
            "(cache_dir=...) at a bigger disk"
        )
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        hint = (
            f"it is not a writable directory: make it one for uid {os.getuid()}, point "
            "AIOLOADER_CACHE_DIR (cache_dir=...) elsewhere, or pass cache_dir=False"
        )
    else:
        hint = "check the disk, or pass cache_dir=False to load without the cache"
    return CacheError(f"model cache {root}: {doing} failed ({exc}); {hint}")


@dataclass(frozen=True)
class Version:
    """What identifies one version of a remote file: its size and validators."""

    size: int
    etag: str | None
    last_modified: str | None

    @property
    def verifiable(self) -> bool:
        """Whether a cached copy can be checked against this version at all."""
        return self.etag is not None or self.last_modified is not None

    def matches(self, meta: Meta) -> bool:
        if not self.verifiable or meta.size != self.size:
            return False
        if self.etag is not None:
            return meta.etag == self.etag
        return meta.last_modified == self.last_modified


@dataclass(frozen=True)
class Meta:
    """The contents of ``meta.json``."""

    url: str
    size: int
    etag: str | None
    last_modified: str | None
    complete: bool
    created: float
    last_used: float
    boot_id: str | None = None
    checksum: str | None = None

    @classmethod
    def new(cls, url: str, version: Version) -> Meta:
        now = time.time()
        return cls(url, version.size, version.etag, version.last_modified, False, now, now, BOOT_ID)


@dataclass(frozen=True)
class EntryFiles:
    """The paths of one entry."""

    root: Path
    dir: Path

    @classmethod
    def of(cls, root: Path, url: str) -> EntryFiles:
        return cls(root, root / "entries" / key_of(url))

    @property
    def meta(self) -> Path:
        return self.dir / "meta.json"

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def partial(self) -> Path:
        return self.dir / "data.partial"

    @property
    def journal(self) -> Path:
        return self.dir / "data.ranges"

    @property
    def lock(self) -> Path:
        return self.dir / "lock"

    @property
    def use(self) -> Path:
        return self.dir / "use"

    def make(self) -> None:
        """Create the entry's folder (no link below the root is followed).

        Raises:
            CacheError: a link was planted on the way.
        """
        make_dirs(self.root, self.dir)

    def exists(self) -> bool:
        """Whether the entry's folder exists (no link below the root is followed)."""
        return check_dirs(self.root, self.dir)

    def bytes_on_disk(self) -> int:
        total = 0
        for path in (self.data, self.partial):
            with contextlib.suppress(OSError):
                total += os.lstat(path).st_blocks * 512
        return total

    def complete_for(self, version: Version) -> Meta | None:
        """The metadata when ``data`` holds exactly ``version``, else None.

        Raises:
            CacheError: a symbolic link was planted on the way to the entry.
        """
        if not self.exists():
            return None
        meta = read_meta(self)
        if meta is None or not meta.complete or not version.matches(meta):
            return None
        if regular_size(self.data) != version.size:
            return None
        return meta

    def discard(self) -> None:
        """Delete the bytes and metadata (not the lock files)."""
        for path in (self.meta, self.data, self.partial, self.journal):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def touch(self, meta: Meta) -> bool:
        """Mark the entry used now; False when the cache is full or read-only.

        The time only orders eviction, so a cache that cannot take it still serves.
        """
        try:
            write_meta(self, replace(meta, last_used=time.time()))
        except OSError as exc:
            if not no_room(exc):
                raise
            return False
        return True


def regular_size(path: Path) -> int | None:
    """The size of a regular file at ``path`` (not a link), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def read_meta(files: EntryFiles) -> Meta | None:
    """The entry's metadata, or None when missing or unreadable (treated as absent)."""
    try:
        doc = json.loads(files.meta.read_bytes())
        return Meta(**doc)
    except (OSError, ValueError, TypeError):
        return None


def write_meta(files: EntryFiles, meta: Meta) -> None:
    """Replace ``meta.json`` atomically: a temporary file, fsync, then rename."""
    temp = files.dir / f".meta.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = open_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, "wb") as fh:
            fh.write(json.dumps(asdict(meta), sort_keys=True).encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, files.meta)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _read_journal(path: Path, size: int) -> RangeSet:
    ranges = RangeSet()
    try:
        fd = open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return ranges
    with open(fd, "rb") as fh:
        text = fh.read().decode(errors="replace")
    for line in text.splitlines():
        parts = line.split()
        # A torn last line (crash mid-append) is ignored: those bytes are fetched again.
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            start, end = int(parts[0]), int(parts[1])
            if 0 <= start < end <= size:
                ranges.add(start, end)
    return ranges


class PartialFile:
    """``data.partial`` and its journal, open for writing by the holder of ``lock``.

    Use ``PartialFile.open`` (resumes a matching partial download, or starts a new
    one), then ``write`` ranges, then ``complete`` or ``close``. Writes also feed
    the entry's checksum (see checksum.py).
    """

    def __init__(
        self,
        files: EntryFiles,
        meta: Meta,
        done: RangeSet,
        fd: int,
        journal: int,
        published: Published | None = None,
    ) -> None:
        self.files = files
        self.meta = meta
        self.done = done
        self._fd: int | None = fd
        self._journal = journal
        self._published = published
        self._digest = PrefixHash(published=published)
        # Threads write different ranges at once; the range set is shared.
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return self.meta.size

    @classmethod
    def open(
        cls, files: EntryFiles, url: str, version: Version, *, published: Published | None = None
    ) -> PartialFile:
        """Resume the partial download of ``version``, or start one from nothing.

        Args:
            published: a digest the server published for the file; ``complete``
                refuses bytes that do not match it.

        Raises:
            OSError: the disk is full or the folder not writable (the caller translates).
            CacheError: a symbolic link was planted in the entry.
        """
        files.make()
        meta = read_meta(files)
        resumable = (
            meta is not None
            and not meta.complete
            and version.matches(meta)
            and meta.boot_id == BOOT_ID
            and regular_size(files.partial) == version.size
        )
        fd = journal = -1
        try:
            if resumable and meta is not None:
                done = _read_journal(files.journal, version.size)
                fd = open_file(files.partial, os.O_RDWR)
            else:
                files.discard()
                meta = Meta.new(url, version)
                done = RangeSet()
                fd = open_file(files.partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
                _preallocate(fd, version.size)
                write_meta(files, meta)
            journal = open_file(files.journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except BaseException:
            for opened in (fd, journal):
                if opened >= 0:
                    os.close(opened)
            if not resumable:
                files.discard()  # nothing half made stays behind
            raise
        return cls(files, meta, done, fd, journal, published)

    def _require(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.files.partial} is closed")
        return self._fd

    def _present(self) -> int:
        with self._lock:
            return min(self.done.prefix(), self.size)

    def write(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Write the bytes of ``buffers`` at ``offset``, journal the range, hash on."""
        fd = self._require()
        position = offset
        for view in clip(buffers, self.size - offset):
            written = 0
            while written < view.nbytes:
                written += os.pwrite(fd, view[written:], position + written)
            position += view.nbytes
        if position > offset:
            with self._lock:
                os.write(self._journal, f"{offset} {position}\n".encode())
                self.done.add(offset, position)
            # The bytes just written are in the page cache: hash them now, not at the end.
            self._digest.advance(fd, self._present)

    def read(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` from bytes already written (see ``done``)."""
        fd = self._require()
        position = offset
        for view in clip(buffers, self.size - offset):
            got = 0
            while got < view.nbytes:
                n = os.preadv(fd, [view[got:]], position + got)
                if n == 0:
                    raise EOFError(position + got)
                got += n
            position += view.nbytes

    def covers(self, start: int, end: int) -> bool:
        with self._lock:
            return self.done.covers(start, min(end, self.size))

    @property
    def finished(self) -> bool:
        return self.covers(0, self.size)

    def complete(self) -> Meta:
        """Make the entry complete: hash the rest, fsync, rename to ``data``, mark it.

        Raises:
            DigestMismatch: the bytes do not match the digest the server published; the
                entry is left as it was (the caller discards it).
            OSError: as the file system reports.
        """
        fd = self._require()
        if not self.finished:
            raise ValueError(f"{self.files.partial} is not complete yet")
        self._digest.advance(fd, lambda: self.size, wait=True)
        actual = self._digest.published_form()
        if self._published is not None and actual != self._published.value:
            raise DigestMismatch(self._published, actual or "")
        os.fsync(fd)
        os.replace(self.files.partial, self.files.data)
        _fsync_dir(self.files.dir)
        now = time.time()
        self.meta = replace(
            self.meta, complete=True, last_used=now, checksum=self._digest.checksum()
        )
        write_meta(self.files, self.meta)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.files.journal)
        self.close()
        return self.meta

    def close(self) -> None:
        """Close the files; the partial download stays resumable. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            os.close(self._journal)


def _preallocate(fd: int, size: int) -> None:
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)
