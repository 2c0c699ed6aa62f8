"""One cache entry on disk: its files, metadata and range journal (sync; run in threads).

An entry is the folder ``<root>/entries/<sha256 of the URL without its signature>/``
(see ``key_of``), its files readable by the owner and group only::

    meta.json       {url (redacted), size, etag, last_modified, complete, created,
                    last_used, boot_id, checksum}: checksum is "xxh3-128:<hex>" of
                    data, once complete
    data            the file's bytes, present only once complete
    data.partial    the bytes being downloaded, preallocated to the full size
    data.ranges     journal of the byte ranges of data.partial already written
    lock            flock(LOCK_EX) by the one process downloading the entry
    use             flock(LOCK_SH) by every reader; eviction needs LOCK_EX
    writer          flock(LOCK_EX) by a holder of ``lock`` that waits for nothing
                    else meanwhile (a fetch, a load's commit): safe to wait for
                    (claim.py)

The lock files (``lock``, ``use``, ``writer``) are never deleted: a process
waiting on a lock file that another one unlinked would hold a lock nobody else
can see. Nothing below the
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
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import CacheError
from ..redact import redact, without_credentials
from ..sources.base import Blob
from .paths import check_dirs, make_dirs, open_file

__all__ = [
    "EntryFiles",
    "Meta",
    "Version",
    "cache_error",
    "discard_quietly",
    "fsync_dir",
    "key_of",
    "no_room",
    "read_meta",
    "regular_size",
    "replace_file",
    "version_of",
    "write_meta",
]


def key_of(url: str) -> str:
    """The entry's folder name: the SHA-256 of the object's URL.

    The URL's signature and credentials are left out (``without_credentials``), so a
    presigned URL signed again for the same object finds the same entry. ``url`` may
    be several URLs, one per line (a model's list of files).
    """
    lines = url.split("\n")
    return hashlib.sha256("\n".join(without_credentials(u) for u in lines).encode()).hexdigest()


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
    return CacheError(
        f"model cache {root}: {doing} failed ({str(exc) or type(exc).__name__}); {hint}"
    )


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


def version_of(blob: Blob) -> Version:
    """The size and validators a remote blob reported when it was opened."""
    return Version(blob.size, blob.etag, blob.last_modified)


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
        """The metadata of a new entry: its URL is kept redacted, no secret at rest."""
        now = time.time()
        return cls(
            redact(url), version.size, version.etag, version.last_modified, False, now, now, BOOT_ID
        )

    def belongs_to(self, url: str) -> bool:
        """Whether this entry was written for ``url`` (as given, or as recorded: redacted)."""
        return redact(self.url) == redact(url)


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

    @property
    def writer(self) -> Path:
        return self.dir / "writer"

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


def discard_quietly(files: EntryFiles) -> None:
    """Delete an entry's bytes when the cache gave up on it (a read-only one keeps them)."""
    with contextlib.suppress(OSError):
        files.discard()


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


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: a temporary file beside it, fsync, rename;
    nothing half-written is ever under its name."""
    temp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = open_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def write_meta(files: EntryFiles, meta: Meta) -> None:
    """Replace ``meta.json`` atomically (``replace_file``)."""
    replace_file(files.meta, json.dumps(asdict(meta), sort_keys=True).encode())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
