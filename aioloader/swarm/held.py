"""The committed files a daemon seeds, and whether each is still the file it seeded.

A cache entry can leave while it is seeded: evicted by the cache's size limit,
removed by ``DELETE /v1/models/{id}`` or by another process on the node, or
replaced by a new version of the file. Each file is recorded when it is published
with the identity of its data (inode, size, modification time); ``gone`` (blocking:
one ``stat`` per file, in a thread) gives those that no longer match, so that their
torrents leave the session and their offers the manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Held", "HeldFile"]


@dataclass(frozen=True)
class HeldFile:
    """One seeded file: its model's key, its name in the manifest, its torrent's info hash."""

    key: str
    name: str
    info_hash: str
    path: Path
    identity: tuple[int, int, int]


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class Held:
    """Seeded files by (model key, file name)."""

    def __init__(self) -> None:
        self._files: dict[tuple[str, str], HeldFile] = {}

    def __len__(self) -> int:
        return len(self._files)

    def add(self, key: str, name: str, info_hash: str, path: Path) -> HeldFile | None:
        """Record ``path`` as seeded (blocking: a ``stat``); the file it replaces, if any.
        A file already gone is not recorded (``gone`` would not see it)."""
        old = self._files.pop((key, name), None)
        identity = _identity(path)
        if identity is not None:
            self._files[key, name] = HeldFile(key, name, info_hash, path, identity)
        return old if old is not None and old.info_hash != info_hash else None

    def gone(self) -> list[HeldFile]:
        """The files no longer there as they were published (blocking); forgotten here."""
        left = [f for f in list(self._files.values()) if _identity(f.path) != f.identity]
        for f in left:
            if self._files.get((f.key, f.name)) is f:
                del self._files[f.key, f.name]
        return left

    def drop(self, key: str) -> list[HeldFile]:
        """Forget every file of the model ``key``; those forgotten."""
        files = [f for k, f in self._files.items() if k[0] == key]
        for f in files:
            del self._files[f.key, f.name]
        return files
