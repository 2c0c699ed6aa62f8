"""DEST of ``aioloader fetch``: its lock, its partial folders, and the commit that
renames a complete copy into place.

Nothing is written outside DEST: sub-folders are opened from DEST's descriptor
without following links, so a link planted at ``DEST/sub`` is refused, not written
through. Every ``OSError`` on the DEST side becomes a ``CacheError`` naming DEST and
what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .errors import CacheError

__all__ = ["PARTIAL_PREFIX", "Destination", "dest_error", "name_problem"]

PARTIAL_PREFIX = ".aioloader-partial-"
_UNTOUCHED = "Nothing of this fetch was left in it"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def name_problem(name: str) -> str | None:
    """Why ``name`` (``/``-separated, relative to DEST) cannot be written safely, or None."""
    parts = name.split("/")
    if not name or "\0" in name or "\\" in name or name.startswith("/"):
        return "is empty, absolute or holds a NUL or a backslash"
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' segment"
    if parts[0].startswith(PARTIAL_PREFIX):
        return "is a name fetch keeps for itself"
    return None


def dest_error(exc: OSError, dest: Path, doing: str, state: str = _UNTOUCHED) -> CacheError:
    """A one-line CacheError for an OSError met while ``doing`` something in DEST;
    ``state`` says what DEST holds now."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "the disk is full: free space there, or fetch into a folder on a bigger disk"
    elif exc.errno == errno.EFBIG:
        hint = "a file is larger than the file system or a limit (ulimit -f) allows there"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = f"it is not writable by uid {os.getuid()}: make it so, or fetch elsewhere"
    elif exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
        hint = "a link, a file or a folder is in the way: remove it, or fetch elsewhere"
    else:
        hint = "check the disk, or fetch elsewhere"
    named = isinstance(exc.filename, str) and exc.filename and exc.filename != str(dest)
    what = f" {exc.filename}" if named else ""
    return CacheError(
        f"aioloader fetch into {dest}: {doing}{what} failed ({exc.strerror or exc}); {hint}. "
        f"{state}; fetch again when that is fixed"
    )


class Destination:
    """DEST, locked: blocking methods, run them in a thread."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd  # DEST itself, flock()ed; every name below is opened from it

    @classmethod
    def open(cls, path: Path) -> Destination:
        """Make DEST, take its lock (waits for another fetch) and remove stale partials."""
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise dest_error(exc, path, "creating") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for stale in path.glob(PARTIAL_PREFIX + "*"):
                shutil.rmtree(stale, ignore_errors=True)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def close(self) -> None:
        os.close(self.fd)

    def new_partial(self) -> Path:
        """A new, empty partial folder in DEST; removed by the next fetch if left."""
        try:
            return Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=self.path))
        except OSError as exc:
            raise dest_error(exc, self.path, "creating a folder in") from None

    def commit(self, partial: Path, names: Sequence[str]) -> None:
        """Rename each file of ``partial`` to its name in DEST (atomic per file), then
        sync the folders."""
        moved = False
        dirs: dict[str, int] = {}
        try:
            for name in names:
                folder, _, base = name.rpartition("/")
                if folder not in dirs:
                    dirs[folder] = self._folder(folder)
                os.replace(partial / name, base, dst_dir_fd=dirs[folder])
                moved = True
            for fd in dirs.values():
                os.fsync(fd)
        except OSError as exc:
            state = "Some of the files are in place" if moved else _UNTOUCHED
            raise dest_error(exc, self.path, "moving the files into place", state) from None
        finally:
            for fd in dirs.values():
                os.close(fd)

    def _folder(self, folder: str) -> int:
        """A descriptor of ``DEST/folder``, made if missing; refuses links on the way."""
        fd = os.dup(self.fd)
        try:
            for part in folder.split("/") if folder else ():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                try:
                    inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise CacheError(
                            f"aioloader fetch into {self.path}: {self.path / folder} is not a "
                            "folder (a link or a file is in the way; fetch writes nothing "
                            "through links): remove it and fetch again"
                        ) from None
                    raise
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd
