"""Local files: ``preadv`` from the owner's lanes (threads.py) straight into destination memory.

Each read goes one of two ways, chosen from what ``mincore`` says of its bytes
(page_cache.py):

* mostly in the page cache ("warm": at least ``WARM_SHARE`` of its pages): a
  memory copy, bound by the CPU, and the kernel reads the few missing pages. It
  runs in the ``warm`` lane, of as many threads as the process may use CPUs: more
  threads only contend for the cores and for the address-space lock their faults take;
* mostly not ("cold"): it waits for the disk, which serves many requests at
  once. It runs in the ``cold`` lane, of ``concurrency`` threads, so the disk
  sees a deep queue, with ``O_DIRECT`` where the file system allows it (direct_io.py).

The pipeline's ``concurrency`` bounds how many reads are in flight either way.
Either way the destination's fresh pages are faulted in first, 2 MiB at a time, in
huge or small pages as the faults show pays here (runtime/page_choice.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from ..errors import (
    AccessDeniedError,
    ClosedError,
    NotFoundError,
    ObjectChangedError,
    ReadError,
    SourceError,
)
from ..runtime.direct_io import DIRECT_IO, fill, is_aligned, read_direct
from ..runtime.page_choice import HUGE
from ..runtime.prefault import populate
from ..runtime.small_files import read_bytes as read_small_file
from ..runtime.threads import Lanes, run_blocking
from .base import Blob, Source
from .file_version import Stamp, changes, checked_stat, require_regular
from .page_cache import PageCache

__all__ = ["FileBlob", "FileSource", "to_path"]


def to_path(url: str) -> str:
    """A filesystem path from a plain path or a ``file://`` URL."""
    if url.startswith("file://"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise SourceError(f"{url}: file URLs must name a local path (file:///path)")
        return unquote(parsed.path)
    return url


def _translate(exc: OSError, url: str, doing: str) -> SourceError:
    if exc.errno == errno.ENOENT:
        return NotFoundError(f"{url} does not exist; check the path (error while {doing} it)")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AccessDeniedError(
            f"permission denied while {doing} {url}; the user running the loader "
            f"(uid {os.getuid()}) needs read access to it and its folders"
        )
    return SourceError(f"{doing} {url} failed: {exc}")


class FileBlob(Blob):
    """An open local file.

    Reads come from the page cache when the bytes are there, and straight from
    the disk with ``O_DIRECT`` when they are not: a cold load then runs at the
    disk's queue-depth speed instead of the page cache's readahead, and does not
    leave a second copy of the weights in the page cache (which counts against
    a container's memory limit).
    """

    def __init__(
        self,
        url: str,
        opened: _Opened,
        lanes: Lanes,
    ) -> None:
        fd, direct, cache, stamp = opened
        self.url = url
        self.size = stamp.size
        self._path = to_path(url)
        self._stamp = stamp
        self._fd: int | None = fd
        self._direct_fd = direct
        self._cache = cache
        self._lanes = lanes

    def __repr__(self) -> str:
        return (
            f"<FileBlob {self.url!r} size={self.size} open={self._fd is not None} "
            f"direct={self._direct_fd is not None}>"
        )

    def _require_fd(self) -> int:
        if self._fd is None:
            raise ClosedError(f"{self.url} was already closed")
        return self._fd

    async def read_bytes(self, offset: int, length: int) -> bytes:
        fd = self._require_fd()
        try:
            return await run_blocking(self._lanes.warm, lambda: os.pread(fd, length, offset))
        except OSError as exc:
            raise _translate(exc, self.url, "reading") from exc

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        fd = self._require_fd()
        size = self.size
        direct = self._direct_fd
        cache = self._cache
        total = sum(b.nbytes for b in buffers)

        def warm() -> bool:
            """Read through the page cache if it holds most of the bytes; False when it does
            not, or when that cannot be asked (the disk's pool is the safe side)."""
            if cache is None or not cache.mostly_holds(offset, max(0, min(total, size - offset))):
                return False
            _fault_in(buffers)
            position = offset
            for buffer in buffers:
                need = max(0, min(buffer.nbytes, size - position))
                fill(fd, buffer[:need], position, need)
                position += buffer.nbytes
            return True

        def cold() -> None:
            _fault_in(buffers)
            position = offset
            for buffer in buffers:
                _read_range(fd, direct, cache, buffer, position, size)
                position += buffer.nbytes

        end = offset + total
        try:
            if not await run_blocking(self._lanes.warm, warm):
                await self._lanes.cold.started()
                await run_blocking(self._lanes.cold, cold)
        except EOFError as exc:
            raise ReadError(
                f"{self.url} ended at byte {exc.args[0]} while reading [{offset}, {end}); the "
                "file shrank during the load (was it being rewritten?)",
                url=self.url,
                start=offset,
                end=end,
            ) from exc
        except OSError as exc:
            raise ReadError(
                f"reading {self.url} bytes [{offset}, {end}) failed: {exc}",
                url=self.url,
                start=offset,
                end=end,
            ) from exc

    async def check_unchanged(self) -> None:
        """Raise ObjectChangedError if the file is not the version that was opened: its
        size, modification or change time moved, or its path names another file now."""
        fd = self._require_fd()
        path, stamp = self._path, self._stamp
        try:
            found = await run_blocking(self._lanes.warm, lambda: changes(fd, path, stamp))
        except OSError as exc:
            raise _translate(exc, self.url, "checking") from exc
        if found:
            raise ObjectChangedError(
                f"{self.url} changed during the load: {found}. Its tensors could mix bytes "
                "of two versions, so the load fails instead: load it again once nothing "
                "writes to it (replace model files by renaming a complete new file over "
                "them, between loads)"
            )

    async def aclose(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _close_all((fd, self._direct_fd, self._cache, self._stamp))
            self._direct_fd = self._cache = None


def _fault_in(buffers: Sequence[memoryview]) -> None:
    """Fault in the buffers that can hold a huge page, in huge or small pages as pays
    here (page_choice.py). Smaller ones fault in as they are read, with no call of
    their own: small reads are many, and hold no huge page to choose for."""
    large = [buffer for buffer in buffers if buffer.nbytes >= HUGE]
    if large:
        populate(large)


def _read_range(
    fd: int, direct: int | None, cache: PageCache | None, buffer: memoryview, offset: int,
    size: int,
) -> None:  # fmt: skip
    """Fill ``buffer`` with the file's bytes at ``offset``; bytes past the end stay as they are."""
    need = max(0, min(buffer.nbytes, size - offset))
    if (
        direct is not None
        and cache is not None
        and is_aligned(offset, buffer)
        and not cache.mostly_holds(offset, need)
        and read_direct(direct, buffer, offset, need)
    ):
        return
    fill(fd, buffer[:need], offset, need)


#: An open file: its descriptor, an O_DIRECT one, its page-cache probe, its version.
_Opened = tuple[int, int | None, PageCache | None, Stamp]


def _open_checked(path: str, url: str, flags: int, expected: Stamp) -> tuple[int, Stamp]:
    """Open ``path`` without blocking and check that it is still the file ``expected``
    describes: it could have been swapped (for a FIFO, too) since it was looked at."""
    fd = os.open(path, flags | os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        require_regular(info, url)
        stamp = Stamp.of(info)
        if not stamp.same_file(expected):
            raise ObjectChangedError(
                f"{url} was replaced by another file while it was being opened; load it "
                "again once nothing writes to it"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, stamp


def _open(path: str, url: str) -> _Opened:
    # stat (which follows symlinks) before open: opening a FIFO for reading waits for a
    # writer, in a thread nothing can cancel. O_NONBLOCK covers a swap in between.
    looked = Stamp.of(checked_stat(path, url))
    fd, stamp = _open_checked(path, url, 0, looked)
    direct = cache = None
    try:
        # Reads go in parallel but mostly forward: let the kernel read ahead.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        if DIRECT_IO and stamp.size > 0:
            with contextlib.suppress(OSError):
                cache = PageCache(fd, stamp.size)
            if cache is not None:
                try:
                    direct, _ = _open_checked(path, url, os.O_DIRECT, stamp)
                except OSError:
                    # tmpfs, some FUSE and network file systems: the page cache only.
                    direct = None
    except BaseException:
        _close_all((fd, direct, cache, stamp))
        raise
    return fd, direct, cache, stamp


def _close_all(opened: _Opened) -> None:
    fd, direct, cache, _ = opened
    if cache is not None:
        cache.close()
    if direct is not None:
        os.close(direct)
    os.close(fd)


def _list(path: str) -> list[str] | None:
    """The names in the folder ``path``, sub-folders marked with a trailing ``/`` (a link
    to a folder is not one: it is listed as a name, which does not open as a file)."""
    if not os.path.isdir(path):
        return None
    with os.scandir(path) as entries:
        return sorted(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name for e in entries)


class FileSource(Source):
    """Files on a local (or mounted) filesystem.

    Args:
        lanes: the owner's threads: reads go to its ``warm`` and ``cold`` lanes (see
            the module docstring); the owner closes them after this source.

    The warm lane's threads are started ahead of the first read (``Lane.start``);
    the cold lane's only when a read first finds its bytes missing from the page
    cache, so a warm load never starts ``concurrency`` threads it does not use (they
    cost a first load in a new process about 100 ms on a 2-CPU machine, whose fresh
    thread stacks fault in slowly).
    """

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        self._started = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<FileSource {self._lanes!r} open={not self._closed}>"

    def _require_lanes(self) -> Lanes:
        if self._closed:
            raise ClosedError("this FileSource is closed")
        if not self._started:
            self._started = True
            self._lanes.warm.start()
        return self._lanes

    async def list_dir(self, url: str) -> list[str] | None:
        path = to_path(url)
        try:
            return await run_blocking(self._require_lanes().warm, lambda: _list(path))
        except OSError as exc:
            raise _translate(exc, url, "listing") from exc

    async def open(self, url: str) -> Blob:
        path = to_path(url)
        lanes = self._require_lanes()
        try:
            opened = await run_blocking(lanes.warm, lambda: _open(path, url), _close_all)
        except OSError as exc:
            raise _translate(exc, url, "opening") from exc
        return FileBlob(url, opened, lanes)

    async def read_file(self, url: str) -> bytes:
        """The whole small file at ``url``, with aiofiles in the warm lane (an index)."""
        return await read_small_file(to_path(url), self._require_lanes().warm)

    def join(self, base: str, name: str) -> str:
        if base.startswith("file://"):
            return base.rstrip("/") + "/" + quote(name)  # to_path decodes it
        return os.path.join(base, name)

    def parent(self, url: str) -> str:
        if url.startswith("file://"):
            return url.rsplit("/", 1)[0]
        return str(Path(url).parent)

    async def aclose(self) -> None:
        self._closed = True
