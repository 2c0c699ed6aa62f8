"""DEST of ``aioloader fetch``: its lock, its partial folders, and the commit that
renames a complete copy into place.

Nothing is written outside DEST: sub-folders are opened from DEST's descriptor
without following links, so a link planted at ``DEST/sub`` is refused, not written
through.
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

__all__ = ["PARTIAL_PREFIX", "Destination", "name_problem"]

PARTIAL_PREFIX = ".aioloader-partial-"
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


class Destination:
    """DEST, locked: blocking methods, run them in a thread."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd  # DEST itself, flock()ed; every name below is opened from it

    @classmethod
    def open(cls, path: Path) -> Destination:
        """Make DEST, take its lock (waits for another fetch) and remove stale partials."""
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
        return Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=self.path))

    def commit(self, partial: Path, names: Sequence[str]) -> None:
        """Rename each file of ``partial`` to its name in DEST (atomic per file), then
        sync the folders."""
        dirs: dict[str, int] = {}
        try:
            for name in names:
                folder, _, base = name.rpartition("/")
                if folder not in dirs:
                    dirs[folder] = self._folder(folder)
                os.replace(partial / name, base, dst_dir_fd=dirs[folder])
            for fd in dirs.values():
                os.fsync(fd)
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
