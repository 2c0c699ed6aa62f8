"""``populate`` faults fresh memory in without changing it (observed with ``mincore``)."""

from __future__ import annotations

import ctypes
import itertools
import mmap
import sys
import threading
import time

import numpy as np
import pytest

from aioloader.runtime.prefault import populate

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="madvise and mincore: Linux")


def resident(area: mmap.mmap) -> list[bool]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    vector = (ctypes.c_ubyte * (len(area) // mmap.PAGESIZE))()
    assert libc.mincore(ctypes.c_void_p(address), len(area), vector) == 0
    return [bool(v & 1) for v in vector]


def test_populate_faults_in_fresh_pages_and_keeps_their_bytes() -> None:
    pages = 64
    area = mmap.mmap(-1, pages * mmap.PAGESIZE)  # anonymous: no page is there until touched
    area.madvise(mmap.MADV_NOHUGEPAGE)
    view = memoryview(area)
    view[: mmap.PAGESIZE] = b"\x07" * mmap.PAGESIZE
    before = resident(area)
    assert before[0] and not any(before[1:])

    # A buffer that starts and ends inside a page, as a read's part of a span may.
    populate([view[100 : 40 * mmap.PAGESIZE + 5]])

    after = resident(area)
    assert all(after[:41]), "the pages of the buffer were not faulted in"
    assert not any(after[41:]), "pages past the buffer were faulted in"
    data = np.frombuffer(area, np.uint8)
    assert (data[: mmap.PAGESIZE] == 7).all() and not data[mmap.PAGESIZE :].any()
    del view, data
    area.close()


def test_populate_leaves_read_only_and_empty_buffers_alone() -> None:
    populate([memoryview(b"read only"), memoryview(bytearray())])


def test_the_process_can_start_threads_while_populate_runs() -> None:
    """Two threads populate 1 GiB of fresh tensor memory while this one starts threads.

    The kernel holds the process's memory map while ``madvise`` faults pages in, and
    starting a thread (its stack is a new mapping) waits for it: in one call for a whole
    buffer, this thread made no progress until every page was in, and the event loop of a
    Hub load stalled for half a second (tests/test_hf_cache.py). Populating step by step
    leaves it room between steps.
    """
    torch = pytest.importorskip("torch")
    area = torch.empty(1 << 30, dtype=torch.uint8)  # fresh: no page of it touched yet
    view = memoryview(area.numpy())
    half = view.nbytes // 2
    parts = (view[:half], view[half:])
    workers = [threading.Thread(target=populate, args=([part],)) for part in parts]
    started = time.perf_counter()
    marks = [started]
    for worker in workers:
        worker.start()
        marks.append(time.perf_counter())
    while any(worker.is_alive() for worker in workers):
        step = threading.Thread(target=lambda: None)
        step.start()
        step.join()
        marks.append(time.perf_counter())
    took = marks[-1] - started
    longest = max(later - earlier for earlier, later in itertools.pairwise(marks))
    assert longest < max(took / 3, 0.02), (
        f"populating 1 GiB took {took * 1000:.0f} ms, and starting one thread meanwhile "
        f"waited {longest * 1000:.0f} ms of it"
    )
    del view, area
