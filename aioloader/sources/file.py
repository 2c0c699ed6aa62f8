"""Local files: ``preadv`` from the owner's lanes (threads.py) straight into destination memory.

Each read goes one of two ways, chosen from what ``mincore`` says of its bytes:

* mostly in the page cache ("warm": at least ``WARM_SHARE`` of its pages): a
  memory copy, bound by the CPU, and the kernel reads the few missing pages. It
  runs in the ``warm`` lane, of as many threads as the process may use CPUs: more
  threads only contend for the cores and for the address-space lock their faults take;
* mostly not ("cold"): it waits for the disk, which serves many requests at
  once. It runs in the ``cold`` lane, of ``concurrency`` threads, so the disk
  sees a deep queue, with ``O_DIRECT`` where the file system allows it.

The pipeline's ``concurrency`` bounds how many reads are in flight either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote, unquote, urlparse

from ..errors import (
    AccessDeniedError,
    ClosedError,
    NotFoundError,
    ObjectChangedError,
    ReadError,
    SourceError,
)
from ..plan import ALIGNMENT
from ..threads import Lanes, run_blocking
from .base import Blob, Source

__all__ = ["FileBlob", "FileSource", "to_path"]

# Direct I/O needs O_DIRECT, and mincore() to ask the page cache first.
_DIRECT_IO = sys.platform == "linux" and hasattr(os, "O_DIRECT")
_libc: Any = None
# A read whose pages are at least this much in the page cache is read through it:
# the kernel fetches only the missing pages. Reading it with O_DIRECT instead
# would fetch every byte from the disk again, and leave the pages that were
# evicted out of the cache for every later load (measured: a 3 GiB model with
# a few evicted pages in most 16 MiB reads loaded at 0.3x a plain preadv).
WARM_SHARE = 0.5


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
            position = offset
            for buffer in buffers:
                need = max(0, min(buffer.nbytes, size - position))
                _fill(fd, buffer[:need], position, need)
                position += buffer.nbytes
            return True

        def cold() -> None:
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
            found = await run_blocking(self._lanes.warm, lambda: _changes(fd, path, stamp))
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


def _read_range(
    fd: int, direct: int | None, cache: _PageCache | None, buffer: memoryview, offset: int,
    size: int,
) -> None:  # fmt: skip
    """Fill ``buffer`` with the file's bytes at ``offset``; bytes past the end stay as they are."""
    need = max(0, min(buffer.nbytes, size - offset))
    if (
        direct is not None
        and cache is not None
        and offset % ALIGNMENT == 0
        and buffer.nbytes % ALIGNMENT == 0
        and not cache.mostly_holds(offset, need)
    ):
        try:
            _fill(direct, buffer, offset, need)
            return
        except OSError as exc:
            # EINVAL: this buffer or filesystem does not allow direct I/O after all.
            if exc.errno != errno.EINVAL:
                raise
    _fill(fd, buffer[:need], offset, need)


class _PageCache:
    """Asks whether the page cache holds a file's bytes, without reading them.

    A plain or ``RWF_NOWAIT`` read would start readahead on a miss and so read
    the bytes twice (once into the page cache, once directly); ``mincore`` on a
    mapping of the file only looks.
    """

    def __init__(self, fd: int, size: int) -> None:
        self._size = size
        self._address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if self._address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")

    def resident(self, offset: int, length: int) -> float:
        """The share of the pages of ``[offset, offset + length)`` in the page cache."""
        if length <= 0:
            return 1.0
        pages = -(-length // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.c_void_p(self._address + offset), length, vector) != 0:
            return 1.0  # cannot tell: the page cache path is always correct
        return 1.0 - bytes(vector).count(0) / pages

    def mostly_holds(self, offset: int, length: int) -> bool:
        """Whether a buffered read of the range is the better way (see ``WARM_SHARE``)."""
        return self.resident(offset, length) >= WARM_SHARE

    def close(self) -> None:
        address, self._address = self._address, None
        if address is not None:
            _libc.munmap(ctypes.c_void_p(address), self._size)


def _load_libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _fill(fd: int, buffer: memoryview, offset: int, need: int) -> int:
    """``preadv`` until ``need`` bytes have arrived; short reads resume where they stopped."""
    got = 0
    while got < need:
        n = os.preadv(fd, [buffer[got:]], offset + got)
        if n == 0:
            raise EOFError(offset + got)
        got += n
    return got


class _Stamp(NamedTuple):
    """What identifies one version of a file: which inode, its size and its last change."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> _Stamp:
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def same_file(self, other: _Stamp) -> bool:
        return (self.dev, self.ino) == (other.dev, other.ino)

    def differences(self, now: _Stamp) -> str:
        """What changed from this stamp to ``now``, in words ("" when nothing did)."""
        if not self.same_file(now):
            return "the path now names another file (it was replaced, e.g. renamed over)"
        changes = []
        if now.size != self.size:
            changes.append(f"its size went from {self.size} to {now.size} bytes")
        if now.mtime_ns != self.mtime_ns:
            changes.append("it was written to (new modification time)")
        elif now.ctime_ns != self.ctime_ns:
            changes.append("its status changed (new change time: a write, chmod or new link)")
        return ", ".join(changes)


#: An open file: its descriptor, an O_DIRECT one, its page-cache probe, its version.
_Opened = tuple[int, int | None, "_PageCache | None", _Stamp]

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _require_regular(info: os.stat_result, url: str) -> None:
    """Refuse anything but a regular file: a FIFO's open or read would wait for a
    writer forever, and a device has no fixed size to check a header against."""
    if stat.S_ISREG(info.st_mode):
        return
    kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
    if stat.S_ISDIR(info.st_mode):
        raise SourceError(f"{url} is a directory where a file was expected")
    raise SourceError(
        f"{url} is {kind}, not a regular file; aioloader reads only regular files (or "
        "symlinks to them), whose size is known and which can be read at any offset: "
        "give the path of the .safetensors file itself"
    )


def _open_checked(path: str, url: str, flags: int, expected: _Stamp) -> tuple[int, _Stamp]:
    """Open ``path`` without blocking and check that it is still the file ``expected``
    describes: it could have been swapped (for a FIFO, too) since it was looked at."""
    fd = os.open(path, flags | os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        _require_regular(info, url)
        stamp = _Stamp.of(info)
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
    global _libc
    # stat (which follows symlinks) before open: opening a FIFO for reading waits for a
    # writer, in a thread nothing can cancel. O_NONBLOCK covers a swap in between.
    looked = _Stamp.of(_checked_stat(path, url))
    fd, stamp = _open_checked(path, url, 0, looked)
    direct = cache = None
    try:
        # Reads go in parallel but mostly forward: let the kernel read ahead.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        if _DIRECT_IO and stamp.size > 0:
            if _libc is None:
                _libc = _load_libc()
            with contextlib.suppress(OSError):
                cache = _PageCache(fd, stamp.size)
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


def _checked_stat(path: str, url: str) -> os.stat_result:
    info = os.stat(path)
    _require_regular(info, url)
    return info


def _changes(fd: int, path: str, stamp: _Stamp) -> str:
    """How the file its path names, or the open file, differs from ``stamp`` ("" if not)."""
    try:
        named = _Stamp.of(os.stat(path))
    except FileNotFoundError:
        return "its path no longer exists (it was removed or renamed)"
    if not stamp.same_file(named):
        return stamp.differences(named)
    # The open file itself: a rename over it also moves its change time (one link less).
    return stamp.differences(_Stamp.of(os.fstat(fd)))


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
