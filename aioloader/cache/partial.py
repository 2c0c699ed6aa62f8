"""A download in progress: ``data.partial`` and its journal of written ranges (sync; run in
threads). See entry.py for the files of an entry.

A load through the cache (caching_source.py) opens its partial file with ``direct=True``:
page-aligned bytes are then written with ``O_DIRECT`` straight from the tensor
memory they were read into. A buffered ``pwrite`` copies every byte into the
page cache (measured here: about 0.9 CPU seconds per GiB, serialized on the
file's lock) and leaves a second copy of the model in memory for the kernel to
write back; a direct write costs the CPU almost nothing and runs at the disk's
speed. The checksum is then computed at ``complete``, from the disk, after the
load has returned (commit.py), instead of while the load waits.

A load into host memory also hands its tensors out before their bytes reach the
disk (write_after.py): the caller may then change a tensor in place before it is written.
So such a write carries a digest of the range taken when the bytes arrived, the
journal keeps it beside the range, and the pass that hashes the file compares
every such range as it goes, before the entry may become complete
(``RangeMismatch`` otherwise).
A resumed partial file serves nothing before each such range has been read back
and found to hold the digest it arrived with (a range that does not is downloaded
again): the tensor may have been changed by a load that was left early, or by a
process killed before its commit. The journal, and what a resumed download trusts of
it (also a ``data`` file a crash left before ``meta.json`` said complete), are journal.py's.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import xxhash

from ..reads.ranges import RangeSet
from ..redact import redacting_logger
from ..runtime.direct_io import DIRECT_IO, fill, write_at
from ..sources.base import clip
from ..sources.digests import Digest
from .checksum import DigestMismatch, PrefixHash, Published
from .entry import EntryFiles, Meta, Version, fsync_dir, read_meta, write_meta
from .journal import Check, digest_of, proven, read_journal, resumable, rewrite_journal
from .paths import open_file

__all__ = ["PartialFile", "RangeMismatch", "range_digest"]

logger = redacting_logger(__name__)


def _nothing() -> None:
    pass


class RangeMismatch(Exception):
    """A range's bytes on disk differ from the bytes that arrived (changed before written)."""


def range_digest(views: Sequence[memoryview]) -> str:
    """The digest ``PartialFile.write`` is given for bytes it may write later."""
    digest = xxhash.xxh3_64()
    for view in views:
        digest.update(view)
    return digest.hexdigest()


class _RangeChecks:
    """The ranges written with a digest of their bytes on arrival (see ``write``),
    checked against the file block by block as the pass that hashes it reads it
    (``PrefixHash``'s observer), so the file is read back once.

    Ranges may overlap (two spans of a plan can share a 4 KiB block): each pending
    range keeps its own running digest. A range that starts below where the pass has
    already read (it overlaps bytes hashed before it was written) is read back from
    the file at ``verify`` instead.
    """

    def __init__(self) -> None:
        # Not yet hashed to their end, in file order: [start, stop, digest, running].
        self._pending: list[list[Any]] = []
        self._late: list[Check] = []  # starting below ``_fed``: read back at verify
        self._fed = 0  # where the hashing pass has reached
        self._bad: Check | None = None
        self._lock = threading.Lock()  # writers add while a hashing thread feeds

    def add(self, check: Check) -> None:
        with self._lock:
            if check[0] < self._fed:
                self._late.append(check)
            else:
                bisect.insort(self._pending, [*check, None], key=lambda p: (p[0], p[1]))

    def feed(self, position: int, data: memoryview) -> None:
        end = position + data.nbytes
        with self._lock:
            self._fed = max(self._fed, end)
            i = 0
            while i < len(self._pending):
                item = self._pending[i]
                start, stop, expected, running = item
                if start >= end:
                    return
                if running is None:
                    running = item[3] = xxhash.xxh3_64()
                low, high = max(start, position), min(stop, end)
                if low < high:
                    running.update(data[low - position : high - position])
                if stop > end:
                    i += 1
                    continue
                if running.hexdigest() != expected and self._bad is None:
                    self._bad = (start, stop, expected)
                del self._pending[i]

    def verify(self, fd: int, path: Path) -> None:
        """Raise ``RangeMismatch`` naming the first range whose bytes changed."""
        with self._lock:
            bad, late = self._bad, list(self._late)
        for check in late:
            if bad is None and digest_of(fd, check[0], check[1]) != check[2]:
                bad = check
        if bad is not None:
            raise RangeMismatch(
                f"bytes [{bad[0]}, {bad[1]}) of {path} are not the bytes that arrived: "
                "a tensor was changed in place before its bytes were written to the cache"
            )


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
        direct: int | None = None,
        digest: Digest | None = None,
    ) -> None:
        self.files = files
        self.meta = meta
        self.done = done
        # Bytes an earlier run wrote, which no source's check has seen in this one.
        self.resumed = bool(done)
        self._resumed_digest = digest if self.resumed else None
        self._running = self._resumed_digest.running() if self._resumed_digest else None
        self._checks = _RangeChecks()
        self._fd: int | None = fd
        self._journal = journal
        self._direct = direct
        self._published = published
        # Called as bytes are written or hashed: the claim's beat (locks.py), so that a
        # process waiting for this entry sees progress.
        self.heartbeat: Callable[[], None] = _nothing
        # The pass that hashes the file also checks the ranges written with a digest.
        self._digest = PrefixHash(published=published, observer=self._observe)
        # Threads write different ranges at once; the range set is shared.
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return self.meta.size

    def _observe(self, position: int, data: memoryview) -> None:
        self._checks.feed(position, data)
        if self._running is not None:
            self._running.update(data)
        self.heartbeat()

    @classmethod
    def open(
        cls,
        files: EntryFiles,
        url: str,
        version: Version,
        *,
        published: Published | None = None,
        direct: bool = False,
        digest: Digest | None = None,
    ) -> PartialFile:
        """Resume the partial download of ``version``, or start one from nothing.

        Args:
            published: a digest the server published for the file; ``complete``
                refuses bytes that do not match it.
            digest: the digest its publisher gives (``Source.publisher_digest``), for a
                download resumed here: the source checks the bytes it reads, but not
                those an earlier run left, so ``complete`` checks the whole file read
                back from the disk, the resumed prefix included, and refuses it
                (``DigestMismatch``) when they differ. Unused for a new download.
            direct: write aligned bytes with ``O_DIRECT`` where the file system
                allows it, and hash at ``complete`` (see the module docstring).

        Raises:
            OSError: the disk is full or the folder not writable (the caller translates).
            CacheError: a symbolic link was planted in the entry.
        """
        files.make()
        meta = read_meta(files)
        resume = resumable(files, meta, version)  # journal.py
        fd = journal = -1
        direct_fd = None
        try:
            if resume and meta is not None:
                plain, arrived = read_journal(files.journal, version.size)
                fd = open_file(files.partial, os.O_RDWR)
                done = proven(fd, plain, arrived, files.partial)
                if arrived:
                    rewrite_journal(files, done)
            else:
                files.discard()
                meta = Meta.new(url, version)
                done = RangeSet()
                fd = open_file(files.partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
                _preallocate(fd, version.size)
                write_meta(files, meta)
            journal = open_file(files.journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            if direct and published is None:
                direct_fd = _open_direct(files)
        except BaseException:
            for opened in (fd, journal):
                if opened >= 0:
                    os.close(opened)
            if not resume:
                files.discard()  # nothing half made stays behind
            raise
        return cls(files, meta, done, fd, journal, published, direct_fd, digest)

    def _require(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.files.partial} is closed")
        return self._fd

    def _present(self) -> int:
        with self._lock:
            return min(self.done.prefix(), self.size)

    def write(self, offset: int, buffers: Sequence[memoryview], digest: str | None = None) -> None:
        """Write the bytes of ``buffers`` at ``offset``, journal the range, hash on.

        ``digest``: ``range_digest`` of the bytes as they arrived, when they may have
        changed since (see the module docstring); ``complete`` checks it.
        """
        fd = self._require()
        position = offset
        for view in clip(buffers, self.size - offset):
            write_at(fd, self._direct, view, position)
            position += view.nbytes
        self._written(fd, offset, position, digest)

    def adopt(self, offset: int, end: int) -> None:
        """Bytes ``[offset, end)`` were written into ``data.partial`` by its own writer
        (a swarm download, ``Blob.landing``), each checked on arrival: journal the range
        and hash on, as ``write`` does after writing."""
        self._written(self._require(), offset, min(end, self.size))

    def _written(self, fd: int, offset: int, end: int, digest: str | None = None) -> None:
        if end <= offset:
            return
        with self._lock:
            line = f"{offset} {end}" if digest is None else f"{offset} {end} {digest}"
            os.write(self._journal, f"{line}\n".encode())
            self.done.add(offset, end)
            if digest is not None:
                self._checks.add((offset, end, digest))
        self.heartbeat()
        if self._direct is None:
            # The bytes just written are in the page cache: hash them now, not at the end.
            self._digest.advance(fd, self._present)

    def read(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` from bytes already written (see ``done``)."""
        fd = self._require()
        position = offset
        for view in clip(buffers, self.size - offset):
            fill(fd, view, position, view.nbytes)
            position += view.nbytes

    def covers(self, start: int, end: int) -> bool:
        with self._lock:
            return self.done.covers(start, min(end, self.size))

    def covered_with(self, submitted: RangeSet) -> bool:
        """Whether the ranges written and ``submitted`` (being written) hold every byte."""
        with self._lock:
            return RangeSet([*self.done, *submitted]).covers(0, self.size)

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
        self._checks.verify(fd, self.files.partial)
        actual = self._digest.published_form()
        if self._published is not None and actual != self._published.value:
            raise DigestMismatch(self._published, actual or "")
        expected = self._resumed_digest
        if expected is not None and self._running is not None:
            got = self._running.result()
            if got != expected.value:
                raise DigestMismatch(
                    Published(expected.algorithm, expected.value, expected.where), got
                )
        os.fsync(fd)
        if self._direct is not None:
            # Hashing read the file back into the page cache: nobody reads it from there.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(self.files.partial, self.files.data)
        fsync_dir(self.files.dir)
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
            if self._direct is not None:
                os.close(self._direct)


def _preallocate(fd: int, size: int) -> None:
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


def _open_direct(files: EntryFiles) -> int | None:
    """A second descriptor of ``data.partial`` for ``O_DIRECT`` writes; None where refused."""
    if not DIRECT_IO:
        return None
    try:
        return open_file(files.partial, os.O_WRONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # tmpfs, some FUSE file systems
            return None
        raise
