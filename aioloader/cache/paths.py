"""What the cache creates stays below its folder (sync; run in threads).

The cache folder itself may be a symbolic link (to a bigger disk, say); nothing
below it may be. Folders are made one component at a time and checked with
``lstat``, files are opened with ``O_NOFOLLOW``, so a link planted below the
folder is refused with a ``CacheError`` naming it, never followed. Names that
come from remote URLs (a file's last segment, a shard's path below its index)
are checked in their final, percent-decoded form, which is the form written.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import CacheError

__all__ = [
    "check_dirs",
    "check_inside",
    "checked_name",
    "link_refused",
    "make_dirs",
    "open_file",
]


def link_refused(path: Path | str) -> CacheError:
    return CacheError(
        f"model cache: {path} is a symbolic link; the cache never follows links below "
        "its folder (only the folder itself may be one): remove the link"
    )


def _name_problem(name: str, nested: bool) -> str | None:
    if not name:
        return "is empty"
    if any(ord(c) < 0x20 or c == "\x7f" for c in name):
        return "holds a control character"
    if name.startswith("/"):
        return "is an absolute path"
    parts = name.split("/")
    if not nested and len(parts) > 1:
        return "holds a '/'"
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' segment"
    if any(len(part.encode()) > 255 for part in parts):
        return "has a segment longer than 255 bytes"
    return None


def checked_name(name: str, url: str, *, nested: bool = False) -> str:
    """``name`` when it is a plain relative path (one segment unless ``nested``).

    Args:
        name: the decoded name, exactly as it is to be written below a cache folder.
        url: the remote file it stands for, named in the error.

    Raises:
        CacheError: ``..``, ``.``, an empty segment, an absolute path, a control
            character, or (without ``nested``) a ``/``.
    """
    problem = _name_problem(name, nested)
    if problem is not None:
        raise CacheError(
            f"model cache: {url} would be linked as {name!r}, which {problem}; nothing was "
            "written. Names are checked after percent-decoding (%2e%2e is '..' and %2f "
            "is '/'): rename the file on the server"
        )
    return name


def make_dirs(root: Path, path: Path) -> None:
    """Create ``path`` and its missing parents below ``root``, refusing links.

    ``root`` itself is created as usual (and may be a link).

    Raises:
        CacheError: a component below ``root`` is a symbolic link.
        OSError: a component is not a folder, or cannot be created.
    """
    root.mkdir(parents=True, exist_ok=True)
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            os.mkdir(current, DIR_MODE)
            continue
        except FileExistsError:
            pass
        mode = os.lstat(current).st_mode
        if stat.S_ISLNK(mode):
            raise link_refused(current)
        if not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(current))


def check_dirs(root: Path, path: Path) -> bool:
    """Whether ``path`` exists as a folder below ``root`` reached without links.

    Raises:
        CacheError: a component below ``root`` is a symbolic link.
    """
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(mode):
            raise link_refused(current)
        if not stat.S_ISDIR(mode):
            return False
    return True


def check_inside(root: Path, path: Path, url: str) -> None:
    """Refuse ``path`` unless its folder, resolved, lies inside the resolved ``root``.

    The last line of defence: names were checked and links refused before.
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(path.parent)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise CacheError(
            f"model cache {root}: {url} would be written to {path}, which resolves to "
            f"{real}, outside the cache; nothing was written"
        )


FILE_MODE = 0o640  # the cache's files: its owner and group (the node's pods), nobody else
DIR_MODE = 0o750


def open_file(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` that refuses a symbolic link as the last component.

    Raises:
        CacheError: ``path`` is a symbolic link.
        OSError: as ``os.open``.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_refused(path) from exc
        raise
