"""Whether the page cache holds a file's bytes, asked with ``mincore`` without reading them.

A local read (file.py) goes through the page cache when it holds most of the bytes,
and straight from the disk with ``O_DIRECT`` (direct_io.py) when it does not. A plain
or ``RWF_NOWAIT`` read would start readahead on a miss and so read the bytes twice
(once into the page cache, once directly); ``mincore`` on a mapping of the file only
looks.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

__all__ = ["WARM_SHARE", "PageCache", "windows"]

# A read whose pages are at least this much in the page cache is read through it:
# the kernel fetches only the missing pages. Reading it with O_DIRECT instead
# would fetch every byte from the disk again, and leave the pages that were
# evicted out of the cache for every later load (measured: a 3 GiB model with
# a few evicted pages in most 16 MiB reads loaded at 0.3x a plain preadv).
WARM_SHARE = 0.5

# A read of more than ``_ASK_ALL`` pages is asked about in ``_WINDOWS`` windows of
# ``_WINDOW_PAGES`` pages spread over it, not page by page. The kernel looks each
# page of a file that is not mapped in up in the page cache's tree, about 70-80 ns
# a page here: asking every page of a warm 3 GiB load cost 55 ms of CPU, the largest
# part of its lag behind a plain preadv (docs/benchmarks.md); its 16 MiB reads asked
# in windows cost 5 ms. One call costs about as much as 60 pages: a read up to
# ``_ASK_ALL`` pages is asked in one. The answer only picks the faster way to read;
# either way reads the right bytes.
_WINDOWS = 8
_WINDOW_PAGES = 8
_ASK_ALL = 256

_libc: Any = None


def _load_libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class PageCache:
    """A read-only mapping of one open file, asked which of its pages are resident.

    Raises:
        OSError: the file cannot be mapped (the caller then reads through the page cache).
    """

    def __init__(self, fd: int, size: int) -> None:
        global _libc
        if _libc is None:
            _libc = _load_libc()
        self._size = size
        self._address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if self._address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")

    def resident(self, offset: int, length: int) -> float:
        """The share of the pages of ``[offset, offset + length)`` in the page cache: of
        every page for a short range, of the pages of its ``windows`` for a long one."""
        if length <= 0:
            return 1.0
        asked = held = 0
        spans = windows(offset, length)
        vector = (ctypes.c_ubyte * -(-max(size for _, size in spans) // mmap.PAGESIZE))()
        mincore, address = _libc.mincore, self._address
        for start, size in spans:
            if mincore(address + start, size, vector) != 0:
                return 1.0  # cannot tell: the page cache path is always correct
            pages = -(-size // mmap.PAGESIZE)
            asked += pages
            held += pages - vector[:pages].count(0)
        return held / asked

    def mostly_holds(self, offset: int, length: int) -> bool:
        """Whether a buffered read of the range is the better way (see ``WARM_SHARE``)."""
        return self.resident(offset, length) >= WARM_SHARE

    def close(self) -> None:
        address, self._address = self._address, None
        if address is not None:
            _libc.munmap(ctypes.c_void_p(address), self._size)


def windows(offset: int, length: int) -> list[tuple[int, int]]:
    """The page-aligned ``(offset, length)`` ranges ``resident`` asks about for ``[offset,
    offset + length)``: its pages all when they are at most ``_ASK_ALL``, else ``_WINDOWS``
    windows of ``_WINDOW_PAGES`` pages spread evenly from its first page to its last."""
    page = mmap.PAGESIZE
    first = offset - offset % page
    end = offset + length
    pages = -(-(end - first) // page)
    if pages <= _ASK_ALL:
        return [(first, end - first)]
    starts = (first + i * (pages - _WINDOW_PAGES) // (_WINDOWS - 1) * page for i in range(_WINDOWS))
    return [(at, min(at + _WINDOW_PAGES * page, end) - at) for at in starts]
