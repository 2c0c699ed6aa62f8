"""Huge or small pages for fresh memory, chosen from what the huge-page faults cost
(runtime/page_choice.py), and ``populate`` following the choice: the flags of the
memory's mapping in ``/proc/self/smaps``, its bytes kept."""

from __future__ import annotations

import mmap
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from aioloader import load_model
from aioloader.runtime import page_choice
from aioloader.runtime.page_choice import HUGE, PageChoice
from aioloader.runtime.prefault import populate

from .helpers import assert_matches_files, random_tensors, write_file
from .servers import FaultyHttpServer

MIB = 1 << 20


def test_fast_huge_pages_are_kept() -> None:
    pages = PageChoice(slow=2e-3, window=8 * MIB, retry=64 * MIB)
    for _ in range(100):
        assert not pages.record(HUGE, 1e-4, huge=True)
    assert pages.start() and not pages.small


def test_slow_huge_pages_over_a_window_turn_to_small_ones() -> None:
    pages = PageChoice(slow=2e-3, window=8 * MIB, retry=64 * MIB)
    assert pages.start()
    assert not pages.record(HUGE, 5e-3, huge=True)  # one slow step is not enough...
    for _ in range(2):
        assert not pages.record(HUGE, 1e-4, huge=True)
    assert not pages.record(HUGE, 1e-4, huge=True)  # ...when the window is fast overall
    for _ in range(3):
        assert not pages.record(HUGE, 5e-3, huge=True)
    assert pages.record(HUGE, 5e-3, huge=True)  # a whole window slow: small from now on
    assert pages.small and not pages.start()


def test_huge_pages_are_tried_again_after_enough_small_ones() -> None:
    pages = PageChoice(slow=2e-3, window=4 * MIB, retry=16 * MIB)
    pages.record(4 * MIB, 1.0, huge=True)
    assert not pages.start()
    for _ in range(7):
        assert pages.record(HUGE, 1e-3, huge=False)
    assert not pages.start()  # 14 MiB small of 16
    pages.record(HUGE, 1e-3, huge=False)
    assert pages.start() and not pages.small  # tried again, judged afresh
    assert not pages.record(4 * MIB, 1e-4, huge=True)


def test_empty_and_odd_steps_decide_nothing_alone() -> None:
    pages = PageChoice(slow=2e-3, window=8 * MIB, retry=64 * MIB)
    for nbytes, seconds in [(0, 0.0), (0, 10.0), (1, 0.0), (4096, -1.0)]:
        assert not pages.record(nbytes, seconds, huge=True)
    assert pages.start()


def test_threads_counting_together_agree() -> None:
    pages = PageChoice(slow=2e-3, window=8 * MIB, retry=1 << 40)
    answers: list[bool] = []

    def steps() -> None:
        for _ in range(1000):
            answers.append(pages.record(HUGE, 1e-2, huge=not pages.small))

    workers = [threading.Thread(target=steps) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert pages.small and not pages.start()
    assert answers[-1] and answers.count(False) <= 4 * 4  # at most a window each, before


linux = pytest.mark.skipif(sys.platform != "linux", reason="madvise and smaps: Linux")


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(" ", 1)[0]
        if "-" in first and not first.endswith(":"):
            low, high = (int(x, 16) for x in first.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.fixture
def fresh() -> Iterator[tuple[memoryview, int]]:
    """48 MiB of fresh private memory that asks for huge pages, 2 MiB-aligned, its first
    page written; and its address."""
    area = mmap.mmap(-1, 50 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(mmap.MADV_HUGEPAGE)
    whole = memoryview(area)
    address = np.frombuffer(area, np.uint8).ctypes.data
    skip = -address % HUGE
    view = whole[skip : skip + 48 * MIB]
    view[:5] = b"\x07" * 5
    yield view, address + skip
    view.release()
    whole.release()
    area.close()


@linux
def test_populate_keeps_huge_pages_while_they_come_fast(fresh: tuple[memoryview, int]) -> None:
    view, address = fresh
    pages = PageChoice(slow=10.0)  # nothing is that slow
    populate([view], pages)
    assert "nh" not in _vm_flags(address + 40 * MIB)
    assert bytes(view[:6]) == b"\x07" * 5 + b"\x00"


@linux
def test_populate_turns_to_small_pages_when_huge_ones_are_slow(
    fresh: tuple[memoryview, int],
) -> None:
    view, address = fresh
    pages = PageChoice(slow=0.0, window=8 * MIB)  # every huge page is too slow
    populate([view], pages)
    assert pages.small
    assert "nh" not in _vm_flags(address)  # the window that judged them
    assert "nh" in _vm_flags(address + 8 * MIB)  # the rest: small pages
    assert "nh" in _vm_flags(address + 48 * MIB - 1)
    assert bytes(view[:6]) == b"\x07" * 5 + b"\x00"
    data = np.frombuffer(view, np.uint8)
    assert not data[5:].any()


@linux
def test_populate_starts_in_small_pages_once_chosen(fresh: tuple[memoryview, int]) -> None:
    view, address = fresh
    pages = PageChoice(slow=0.0, window=HUGE, retry=1 << 40)
    pages.record(HUGE, 1.0, huge=True)
    assert pages.small
    populate([view[MIB:]], pages)  # starting inside a page of the buffer
    assert "nh" in _vm_flags(address + MIB)
    assert "nh" in _vm_flags(address + 47 * MIB)
    assert bytes(view[:6]) == b"\x07" * 5 + b"\x00"


@pytest.fixture
def small_pages_chosen(monkeypatch: pytest.MonkeyPatch) -> PageChoice:
    """The process's choice, as after slow huge pages: small pages for fresh memory."""
    pages = page_choice.PAGES
    monkeypatch.setattr(pages, "_small", True)
    monkeypatch.setattr(pages, "_small_bytes", 0)
    return pages


@linux
async def test_a_remote_load_follows_the_process_choice(
    http_server: FaultyHttpServer, small_pages_chosen: PageChoice
) -> None:
    path = write_file(http_server.root / "model.safetensors", random_tensors(big=6 << 20))
    got = await load_model(http_server.url_for("model.safetensors"), chunk_size="4MiB")
    assert_matches_files(got, path)
    big = max(got.values(), key=lambda t: t.nbytes)
    assert "nh" in _vm_flags(big.data_ptr() + big.nbytes // 2)
    assert small_pages_chosen.small


@linux
@pytest.mark.parametrize("warm", [True, False])
async def test_a_local_load_follows_the_process_choice(
    tmp_path: Path, small_pages_chosen: PageChoice, warm: bool
) -> None:
    path = write_file(tmp_path / "model.safetensors", random_tensors(big=6 << 20))
    if not warm:  # out of the page cache: the cold lane's reads, O_DIRECT where allowed
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    got = await load_model(str(path), chunk_size="4MiB")
    assert_matches_files(got, path)
    big = max(got.values(), key=lambda t: t.nbytes)
    assert "nh" in _vm_flags(big.data_ptr() + big.nbytes // 2)


async def test_a_local_load_of_small_tensors_faults_them_in_as_it_reads(tmp_path: Path) -> None:
    """Buffers too small for a huge page are not populated, a system call each: they
    hold no huge page to choose for, and small reads are many."""
    tensors = {f"t{i}": torch.full((16 << 10,), float(i)) for i in range(16)}  # 64 KiB each
    path = write_file(tmp_path / "model.safetensors", tensors)
    before = page_choice.PAGES.counted
    got = await load_model(str(path))
    assert_matches_files(got, path)
    assert page_choice.PAGES.counted == before
