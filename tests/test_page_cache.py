"""Reads of local files through the page cache or around it, as ``mincore`` says.

The page cache is observed with the real ``mincore`` on a mapping of the file,
the file is a real file on the test's disk, and pages are evicted with
``posix_fadvise(DONTNEED)``, which drops clean pages of a file nobody maps.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from aioloader import Loader, load_model
from aioloader.sources.page_cache import PageCache, windows

from .helpers import assert_matches_files, write_file

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mincore and O_DIRECT: Linux")

PAGE = mmap.PAGESIZE
MiB = 1 << 20


def resident_pages(path: Path) -> list[bool]:
    """Which pages of ``path`` the page cache holds now."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        try:
            vector = (ctypes.c_ubyte * (-(-size // PAGE)))()
            assert libc.mincore(ctypes.c_void_p(address), size, vector) == 0
            return [bool(v & 1) for v in vector]
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)


def evict(path: Path, offset: int, length: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def written(path: Path) -> Path:
    """``path`` on the disk: the page cache drops only clean pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def cache_all_but(path: Path, missing: set[int]) -> None:
    """Bring every page of ``path`` into the page cache except those in ``missing``.

    Page by page, with readahead off: a page read in a larger folio could not be
    dropped on its own, and readahead would bring the missing pages in.
    """
    evict(path, 0, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for page in range(-(-path.stat().st_size // PAGE)):
            if page not in missing:
                os.pread(fd, PAGE, page * PAGE)
    finally:
        os.close(fd)


async def test_a_mostly_cached_file_is_read_through_the_page_cache(tmp_path: Path) -> None:
    """A few evicted pages in each read: those pages are fetched, the rest copied.

    Reading such a read with O_DIRECT, as aioloader did, fetched all of it from
    the disk again and left the evicted pages out of the cache for good.
    """
    path = written(write_file(tmp_path / "m.safetensors", {"w": torch.randn(4 * MiB)}))  # 16 MiB
    size = path.stat().st_size
    missing = {offset // PAGE for offset in range(MiB, size - PAGE, MiB)}  # one page per MiB
    cache_all_but(path, missing)
    before = resident_pages(path)
    if all(before) or sum(before) < len(before) // 2:
        pytest.skip("this file system does not let a test choose what the page cache holds")

    got = await load_model(str(path), chunk_size="1MiB")
    after = resident_pages(path)  # before the check below reads the file itself
    assert_matches_files(got, path)
    assert all(after), "the evicted pages were read around the page cache"


async def test_a_cold_file_is_read_around_the_page_cache(tmp_path: Path) -> None:
    """With O_DIRECT, a cold load leaves no second copy of the weights in memory."""
    path = written(write_file(tmp_path / "m.safetensors", {"w": torch.randn(4 * MiB)}))
    evict(path, 0, 0)
    if sum(resident_pages(path)) > 0:
        pytest.skip("this file system keeps pages posix_fadvise asked to drop (tmpfs?)")

    got = await load_model(str(path), chunk_size="1MiB")
    after = resident_pages(path)  # before the check below reads the file itself
    assert_matches_files(got, path)
    # The header and the file's last partial page are read through the page cache.
    assert sum(after) <= 128


def reader_threads() -> set[str]:
    return {
        t.name.rsplit("_", 1)[0] for t in threading.enumerate() if t.name.startswith("aioloader")
    }


async def test_a_warm_load_starts_no_disk_readers(tmp_path: Path) -> None:
    """The disk's pool of ``concurrency`` threads starts only for a read the page cache
    cannot serve: a first load in a new process paid about 100 ms for threads a warm
    load never used."""
    path = write_file(tmp_path / "m.safetensors", {"w": torch.randn(4 * MiB)})
    path.read_bytes()
    if not all(resident_pages(path)):
        pytest.skip("the page cache would not keep the file")

    async with Loader(chunk_size="1MiB", concurrency=8) as loader:
        got = await loader.load(str(path))
        started = reader_threads()
    assert_matches_files(got, path)
    assert "aioloader-warm" in started
    assert "aioloader-cold" not in started


async def test_a_cold_load_starts_the_disk_readers(tmp_path: Path) -> None:
    path = written(write_file(tmp_path / "m.safetensors", {"w": torch.randn(4 * MiB)}))
    evict(path, 0, 0)
    if sum(resident_pages(path)) > 0:
        pytest.skip("this file system keeps pages posix_fadvise asked to drop (tmpfs?)")

    async with Loader(chunk_size="1MiB", concurrency=8) as loader:
        got = await loader.load(str(path))
        started = [t.name for t in threading.enumerate() if t.name.startswith("aioloader-cold")]
    assert_matches_files(got, path)
    assert len(started) == 8


@pytest.mark.parametrize(
    "offset, length",
    [(0, 1), (100, 5000), (0, 256 * PAGE), (0, 256 * PAGE + 1), (3 * PAGE + 5, 16 * MiB),
     (0, 1 << 40), (7 * PAGE, 257 * PAGE)],
)  # fmt: skip
def test_a_long_read_is_asked_about_in_a_few_windows_that_span_it(offset: int, length: int) -> None:
    """Asking every page of a warm 3 GiB load cost 55 ms of CPU (about 70 ns a page):
    a long read is asked about in windows of a bounded number of pages, from its
    first page to its last, each page-aligned and inside the read's pages."""
    first, end = offset - offset % PAGE, offset + length
    asked = windows(offset, length)
    assert asked[0][0] == first
    assert asked[-1][0] + asked[-1][1] == end
    for start, size in asked:
        assert start % PAGE == 0
        assert first <= start and start + size <= end and size > 0
    assert [s for s, _ in asked] == sorted({s for s, _ in asked})
    pages = sum(-(-size // PAGE) for _, size in asked)
    assert pages <= max(256, 8 * 8)
    if -(-(end - first) // PAGE) > 256:
        assert pages <= 64, "a long read asked about page by page"


def page_cache_of(path: Path) -> PageCache:
    fd = os.open(path, os.O_RDONLY)
    try:
        return PageCache(fd, path.stat().st_size)
    finally:
        os.close(fd)  # the mapping outlives the descriptor


@pytest.mark.parametrize(
    "missing, held",
    [
        (lambda pages: set(), True),
        (lambda pages: set(range(0, pages, 256)), True),  # one page per MiB
        (lambda pages: set(range(pages // 4, pages)), False),  # the last three quarters
        (lambda pages: set(range(0, pages * 3 // 4)), False),  # the first three quarters
        (lambda pages: set(range(pages // 4)), True),  # the first quarter
        (lambda pages: set(range(0, pages, 2)), None),  # every other page: about half
    ],
)
def test_the_windows_tell_a_mostly_cached_read_from_a_mostly_cold_one(
    tmp_path: Path, missing: Callable[[int], set[int]], held: bool | None
) -> None:
    path = written(write_file(tmp_path / "m.safetensors", {"w": torch.randn(8 * MiB)}))  # 32 MiB
    pages = -(-path.stat().st_size // PAGE)
    gone = missing(pages)
    cache_all_but(path, gone)
    if resident_pages(path) != [page not in gone for page in range(pages)]:
        pytest.skip("this file system does not let a test choose what the page cache holds")
    cache = page_cache_of(path)
    try:
        share = cache.resident(0, pages * PAGE)
        if held is None:
            assert 0.4 <= share <= 0.6
        else:
            assert cache.mostly_holds(0, pages * PAGE) is held
            assert share == pytest.approx(1 - len(gone) / pages, abs=0.15)
    finally:
        cache.close()
