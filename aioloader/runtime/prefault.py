"""Faulting in fresh destination memory off the event loop.

A remote read receives its body on the event loop, straight into the tensor's
memory (sources/http/client.py). Memory the process has never touched is faulted in
by the kernel on the first write to each page, inside that ``recv``: zeroing a
2 MiB huge page, and on a VM whose host has taken the memory back, waiting for
the host to hand it over again (docs/benchmarks.md measures loads into fresh memory).
All of that then runs on the loop's one thread, in turn with receiving.

``populate`` asks the kernel to fault a range in without touching its bytes
(``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+), from a worker thread, while the
request is on its way: by the time the body arrives, its pages are there. It does so
a step at a time (``_STEP``), so the memory map the kernel holds meanwhile is free
between steps for the rest of the process, the event loop's thread included.
Where the call is not available it does nothing, and the loop faults pages in
as before. Each step is timed, and where fresh huge pages are slow to come (a VM
whose host took free memory back), the memory after them goes into small pages
(page_choice.py).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import sys
import time
from collections.abc import Sequence
from typing import Any

from .page_choice import PAGES, PageChoice

__all__ = ["populate"]

_MADV_POPULATE_WRITE = 23
_MADV_NOHUGEPAGE = 15
_libc: Any = None
_works = sys.platform == "linux"
# One madvise call faults in at most this much: the kernel holds the process's memory
# map through a call, and whatever else needs it meanwhile (starting a thread, mapping
# a buffer, a fault in another thread) waits; a call per whole buffer held it for the
# buffer's every page (tests/test_prefault.py).
_STEP = 2 << 20


def _madvise() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc = libc
    return _libc.madvise


def populate(buffers: Sequence[memoryview], pages: PageChoice = PAGES) -> None:
    """Fault in the pages of ``buffers`` for writing, without changing their bytes
    (blocking); in huge or small pages as ``pages`` finds pays (page_choice.py)."""
    global _works
    if not _works:
        return
    madvise = _madvise()
    for buffer in buffers:
        if buffer.readonly or buffer.nbytes == 0:
            continue
        address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        start = address - address % mmap.PAGESIZE
        end = address + buffer.nbytes
        huge = pages.start()
        if not huge:
            _small_pages(madvise, start, end)
        for at in range(start, end, _STEP):
            size = min(_STEP, end - at)
            began = time.thread_time()
            if madvise(ctypes.c_void_p(at), size, _MADV_POPULATE_WRITE):
                code = ctypes.get_errno()
                if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                    _works = False  # an older kernel, or memory it will not populate: leave it
                return
            if pages.record(size, time.thread_time() - began, huge) and huge:
                huge = False
                _small_pages(madvise, at + size, end)


def _small_pages(madvise: Any, start: int, end: int) -> None:
    """Mark the whole pages of ``[start, end)`` as not for huge pages (best effort: the
    kernel may refuse, and the memory stays as it was made)."""
    end -= end % mmap.PAGESIZE
    if end > start:
        madvise(ctypes.c_void_p(start), end - start, _MADV_NOHUGEPAGE)
