"""The journal of a partial download (``data.ranges``), and what a resumed download may
trust of the bytes it names (sync; run in threads). See entry.py for the files of an entry.

Each line is a range written into ``data.partial``: ``start end`` for bytes written from
memory nobody else held, ``start end digest`` for bytes written after they were handed
out (write_after.py), with their digest on arrival. A resumed download trusts the first
kind as written and reads the second back: only a range that still has its digest is
kept (``proven``); a caller may have changed the tensor before it was written.

A crash can also come between ``PartialFile.complete``'s rename of ``data.partial`` to
``data`` and its write of the complete ``meta.json``: ``data`` is there, fsynced before
the rename, while ``meta.json`` still says partial and the journal is still beside it.
``resumable`` takes such a file back as the partial file it was, so that it is checked
against its journal and completed (hashed, compared with the published digest) like any
resumed download, not thrown away and downloaded again. Its bytes reached the disk
before the rename, so it is taken back after a reboot too; a ``data.partial`` is not
(its bytes may never have left the page cache).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import xxhash

from ..reads.ranges import RangeSet
from ..redact import redacting_logger
from .entry import (
    BOOT_ID,
    EntryFiles,
    Meta,
    Version,
    fsync_dir,
    regular_size,
    replace_file,
    write_meta,
)
from .paths import open_file

__all__ = ["Check", "digest_of", "proven", "read_journal", "resumable", "rewrite_journal"]

logger = redacting_logger(__name__)

_CHECK_BLOCK = 8 << 20  # bytes read at once when a resumed range is checked

Check = tuple[int, int, str]  # a range written after hand-out, and its digest on arrival


def resumable(files: EntryFiles, meta: Meta | None, version: Version) -> bool:
    """Whether the entry holds a partial download of ``version`` to resume in
    ``data.partial``: one of this boot, or a ``data`` file a crash left before its
    ``meta.json`` said complete (taken back to ``data.partial`` here).

    Raises:
        OSError: taking ``data`` back failed.
    """
    if meta is None or meta.complete or not version.matches(meta):
        return False
    if os.path.lexists(files.partial):
        return meta.boot_id == BOOT_ID and regular_size(files.partial) == version.size
    if regular_size(files.data) != version.size or regular_size(files.journal) is None:
        return False
    os.replace(files.data, files.partial)
    fsync_dir(files.dir)
    if meta.boot_id != BOOT_ID:
        write_meta(files, replace(meta, boot_id=BOOT_ID))  # its bytes are on disk
    logger.info(
        "%s: taking back %s, renamed from %s before its entry was marked complete (the "
        "process stopped in between): it is checked against its journal instead of "
        "downloaded again", meta.url, files.data, files.partial.name,
    )  # fmt: skip
    return True


def read_journal(path: Path, size: int) -> tuple[RangeSet, list[Check]]:
    """The ranges written from memory nobody else held, and those written with a digest."""
    plain = RangeSet()
    checks: list[Check] = []
    try:
        fd = open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return plain, checks
    with open(fd, "rb") as fh:
        text = fh.read().decode(errors="replace")
    for line in text.splitlines():
        parts = line.split()
        # A torn last line (crash mid-append) is ignored: those bytes are fetched again.
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]):
            continue
        if len(parts) == 3 and len(parts[2]) != 16:
            continue
        start, end = int(parts[0]), int(parts[1])
        if 0 <= start < end <= size:
            if len(parts) == 3:
                checks.append((start, end, parts[2]))
            else:
                plain.add(start, end)
    return plain, checks


def digest_of(fd: int, start: int, end: int) -> str:
    """``range_digest`` of bytes ``[start, end)`` of the file, as they are on disk."""
    digest = xxhash.xxh3_64()
    position = start
    while position < end:
        block = os.pread(fd, min(_CHECK_BLOCK, end - position), position)
        if not block:
            break  # shorter than the journal says: cannot match
        digest.update(block)
        position += len(block)
    return digest.hexdigest()


def _subtract(ranges: Sequence[tuple[int, int]], cuts: Sequence[tuple[int, int]]) -> RangeSet:
    out = RangeSet()
    for start, end in ranges:
        pieces = [(start, end)]
        for cut_start, cut_end in cuts:
            pieces = [
                piece
                for low, high in pieces
                for piece in ((low, min(high, cut_start)), (max(low, cut_end), high))
                if piece[0] < piece[1]
            ]
        for low, high in pieces:
            out.add(low, high)
    return out


def proven(fd: int, plain: RangeSet, checks: Sequence[Check], where: Path) -> RangeSet:
    """The ranges of a resumed partial file whose bytes are the remote's.

    A range written with a digest was written from a tensor its caller held (write_after.py)
    and may have been changed in place before it reached the disk, by a process that
    may have died since: it is read back and kept only when its bytes still have the
    digest taken when they arrived. Nothing is served from the file before this.
    """
    bad = [(start, end) for start, end, digest in checks if digest_of(fd, start, end) != digest]
    good = RangeSet([*plain, *((start, end) for start, end, _ in checks)])
    if not bad:
        return good
    logger.warning(
        "%s: %d ranges (%s) are not the bytes that arrived (a tensor was changed in place "
        "before its bytes were written to the cache); they are downloaded again",
        where, len(bad), ", ".join(f"[{start}, {end})" for start, end in bad[:4]),
    )  # fmt: skip
    return _subtract(list(good), bad)


def rewrite_journal(files: EntryFiles, done: RangeSet) -> None:
    """Replace the journal with ``done``'s ranges, proven: no digest left to check."""
    replace_file(files.journal, "".join(f"{start} {end}\n" for start, end in done).encode())
