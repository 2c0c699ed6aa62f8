"""``O_DIRECT`` reads and writes, and the ``preadv`` loop under every read (sync; run in lanes).

Direct I/O moves bytes between the disk and the caller's memory without a copy in the
page cache: a cold load then runs at the disk's queue depth and leaves no second copy
of the weights in memory, and a cache write costs the CPU almost nothing. It asks that
offsets, lengths and memory addresses be multiples of ``ALIGNMENT``; a file system or a
buffer that refuses anyway answers ``EINVAL``, and the caller falls back to a buffered
read or write of the same bytes.

Local files (sources/file.py) read through it; the node cache (cache/partial.py) writes
through it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

__all__ = [
    "ALIGNMENT",
    "DIRECT_IO",
    "fill",
    "is_aligned",
    "read_direct",
    "write_at",
    "write_direct",
]

#: What ``O_DIRECT`` asks of offsets, lengths and addresses on every disk we know.
ALIGNMENT = 4096
#: Whether this platform has ``O_DIRECT`` at all (Linux).
DIRECT_IO = sys.platform == "linux" and hasattr(os, "O_DIRECT")


def fill(fd: int, buffer: memoryview, offset: int, need: int) -> int:
    """``preadv`` until ``need`` bytes have arrived; short reads resume where they stopped.

    Raises:
        EOFError: the file ended first; its argument is the offset where it did.
        OSError: as the file system reports.
    """
    got = 0
    while got < need:
        n = os.preadv(fd, [buffer[got:]], offset + got)
        if n == 0:
            raise EOFError(offset + got)
        got += n
    return got


def is_aligned(offset: int, buffer: memoryview) -> bool:
    """Whether a read of ``buffer`` at ``offset`` meets ``O_DIRECT``'s offset and length rule."""
    return offset % ALIGNMENT == 0 and buffer.nbytes % ALIGNMENT == 0


def read_direct(fd: int, buffer: memoryview, offset: int, need: int) -> bool:
    """Read ``need`` bytes at ``offset`` into the aligned ``buffer`` through the ``O_DIRECT``
    descriptor ``fd``; False when this buffer or file system refuses direct I/O after all
    (the caller reads the bytes buffered instead)."""
    try:
        fill(fd, buffer, offset, need)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    return True


def _address(view: memoryview) -> int | None:
    """Where ``view``'s bytes start in memory; None for read-only memory (ctypes cannot say)."""
    if view.readonly or view.nbytes == 0:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def write_direct(fd: int, view: memoryview, position: int) -> int:
    """Write the longest page-aligned start of ``view`` with ``O_DIRECT``; returns bytes written.

    The rest (a file's last partial page, or everything when ``view`` or
    ``position`` is not aligned) is left to a buffered write.
    """
    address = _address(view)
    if address is None or position % ALIGNMENT or address % ALIGNMENT:
        return 0
    aligned = view.nbytes - view.nbytes % ALIGNMENT
    written = 0
    while written < aligned:
        try:
            n = os.pwrite(fd, view[written:aligned], position + written)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # this memory or file system refuses after all
                return written
            raise
        written += n
        if n % ALIGNMENT:
            break  # a short write off the block grid: buffered writes finish it
    return written


def write_at(fd: int, direct: int | None, view: memoryview, position: int) -> None:
    """Write all of ``view`` at ``position``: its page-aligned start with ``O_DIRECT``
    through ``direct`` where there is one (``write_direct``), the rest buffered through
    ``fd``, a descriptor of the same file."""
    written = 0 if direct is None else write_direct(direct, view, position)
    while written < view.nbytes:
        written += os.pwrite(fd, view[written:], position + written)
