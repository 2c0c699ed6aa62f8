"""Which version of which file a path names: its ``Stamp``, and how a later look differs.

A local load opens each file once and checks at the end that its path still names the
same, unchanged file (file.py): a file rewritten during the load could mix bytes of two
versions into its tensors. Only regular files are read at all.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

from ..errors import SourceError

__all__ = ["Stamp", "changes", "checked_stat", "require_regular"]


class Stamp(NamedTuple):
    """What identifies one version of a file: which inode, its size and its last change."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> Stamp:
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def same_file(self, other: Stamp) -> bool:
        return (self.dev, self.ino) == (other.dev, other.ino)

    def differences(self, now: Stamp) -> str:
        """What changed from this stamp to ``now``, in words ("" when nothing did)."""
        if not self.same_file(now):
            return "the path now names another file (it was replaced, e.g. renamed over)"
        found = []
        if now.size != self.size:
            found.append(f"its size went from {self.size} to {now.size} bytes")
        if now.mtime_ns != self.mtime_ns:
            found.append("it was written to (new modification time)")
        elif now.ctime_ns != self.ctime_ns:
            found.append("its status changed (new change time: a write, chmod or new link)")
        return ", ".join(found)


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def require_regular(info: os.stat_result, url: str) -> None:
    """Refuse anything but a regular file: a FIFO's open or read would wait for a
    writer forever, and a device has no fixed size to check a header against."""
    if stat.S_ISREG(info.st_mode):
        return
    kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
    if stat.S_ISDIR(info.st_mode):
        raise SourceError(f"{url} is a directory where a file was expected")
    raise SourceError(
        f"{url} is {kind}, not a regular file; aioloader reads only regular files (or "
        "symlinks to them), whose size is known and which can be read at any offset: "
        "give the path of the .safetensors file itself"
    )


def checked_stat(path: str, url: str) -> os.stat_result:
    """``stat`` (following symlinks) of what must be a regular file."""
    info = os.stat(path)
    require_regular(info, url)
    return info


def changes(fd: int, path: str, stamp: Stamp) -> str:
    """How the file its path names, or the open file, differs from ``stamp`` ("" if not)."""
    try:
        named = Stamp.of(os.stat(path))
    except FileNotFoundError:
        return "its path no longer exists (it was removed or renamed)"
    if not stamp.same_file(named):
        return stamp.differences(named)
    # The open file itself: a rename over it also moves its change time (one link less).
    return stamp.differences(Stamp.of(os.fstat(fd)))
