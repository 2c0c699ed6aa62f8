"""The swarm's scratch folder in the cache: ``<cache>/.swarm/incoming/<node id>/``.

A follower's downloads land there before the cache copies them into its entries
(source.py). Each daemon has a folder of its own, named after its node id, and holds
an exclusive lock on ``<node id>.lock`` beside it for as long as it runs: two daemons
on one cache folder never touch each other's downloads. At start, a daemon removes
what crashed runs left behind: every folder whose lock no live process holds (a
kill -9, a machine that died), and anything else in ``incoming/``. Blocking: run in
a thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from pathlib import Path

from ..redact import redacting_logger

__all__ = ["Scratch", "linked", "unlinked"]

logger = redacting_logger(__name__)

_LOCK = ".lock"


class Scratch:
    """This daemon's scratch folder; ``open()`` takes it and clears leftovers,
    ``close()`` removes it."""

    def __init__(self, incoming: Path, node: str) -> None:
        self.incoming = incoming
        self.folder = incoming / node
        self._lock_path = incoming / (node + _LOCK)
        self._fd: int | None = None

    def open(self) -> Path:
        """Lock this daemon's folder and remove leftovers of dead daemons; the folder."""
        self.incoming.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(self._lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # another daemon took it for a leftover between open and lock
        self._fd = fd
        self._clear_leftovers()
        self.folder.mkdir(exist_ok=True)
        return self.folder

    def _clear_leftovers(self) -> None:
        for path in self.incoming.iterdir():
            if path in (self.folder, self._lock_path):
                continue
            if path.name.endswith(_LOCK):
                owner = path.with_name(path.name[: -len(_LOCK)])
                if self._take(path):  # its daemon is gone: its downloads with it
                    shutil.rmtree(owner, ignore_errors=True)
                    with contextlib.suppress(OSError):
                        path.unlink()
                    logger.info("removed the swarm downloads a stopped daemon left: %s", owner)
                continue
            if (path.parent / (path.name + _LOCK)).exists():
                continue  # a live daemon's folder (its lock is checked above)
            logger.info("removed a swarm download left behind: %s", path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()

    @staticmethod
    def _take(lock: Path) -> bool:
        """Whether no process holds ``lock`` (taken and let go at once)."""
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        finally:
            os.close(fd)  # closing lets go of the lock too
        return True

    def close(self) -> None:
        """Remove this daemon's folder and let go of its lock; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self._lock_path.unlink()
        os.close(fd)


def linked(path: Path, folder: Path) -> Path:
    """A hard link to the file at ``path`` in ``folder`` (blocking), or ``path`` itself
    where none can be made (another file system): a name that the cache's commit, a
    rename of ``path``, leaves in place, so that torrents reading and writing the file
    by name go on across it. Peers asked for ranges that a node downloaded got "No such
    file or directory" from the moment the entry was renamed until its torrents were
    seeded again from the committed file (32 nodes: 60 torrents failed)."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / f"{uuid.uuid4().hex[:16]}-{path.name}"
    try:
        os.link(path, link)
    except OSError as exc:
        logger.info("%s: no link in %s (%s); its torrents use its own name", path, folder, exc)
        return path
    return link


def unlinked(link: Path, path: Path) -> None:
    """Remove ``link`` (``linked``'s), unless it is ``path`` itself (blocking)."""
    if link != path:
        with contextlib.suppress(OSError):
            link.unlink()
