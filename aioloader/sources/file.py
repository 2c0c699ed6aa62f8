"""Local files: ``preadv`` from a bounded thread pool straight into destination memory."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlparse

from .._threads import run_blocking
from ..errors import AccessDeniedError, ClosedError, NotFoundError, ReadError, SourceError
from .base import Blob, Source

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
    """An open local file."""

    def __init__(self, url: str, fd: int, size: int, executor: ThreadPoolExecutor) -> None:
        self.url = url
        self.size = size
        self._fd: int | None = fd
        self._executor = executor

    def __repr__(self) -> str:
        return f"<FileBlob {self.url!r} size={self.size} open={self._fd is not None}>"

    def _require_fd(self) -> int:
        if self._fd is None:
            raise ClosedError(f"{self.url} was already closed")
        return self._fd

    async def read_bytes(self, offset: int, length: int) -> bytes:
        fd = self._require_fd()
        try:
            return await run_blocking(self._executor, lambda: os.pread(fd, length, offset))
        except OSError as exc:
            raise _translate(exc, self.url, "reading") from exc

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        fd = self._require_fd()
        try:
            await run_blocking(self._executor, lambda: _preadv_full(fd, buffers, offset))
        except EOFError as exc:
            end = offset + sum(b.nbytes for b in buffers)
            raise ReadError(
                f"{self.url} ended at byte {exc.args[0]} while reading [{offset}, {end}); the "
                "file shrank during the load (was it being rewritten?)",
                url=self.url,
                start=offset,
                end=end,
            ) from exc
        except OSError as exc:
            end = offset + sum(b.nbytes for b in buffers)
            raise ReadError(
                f"reading {self.url} bytes [{offset}, {end}) failed: {exc}",
                url=self.url,
                start=offset,
                end=end,
            ) from exc

    async def aclose(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _preadv_full(fd: int, buffers: Sequence[memoryview], offset: int) -> None:
    """``preadv`` until every buffer is full; short reads resume where they stopped."""
    pending = list(buffers)
    while pending:
        n = os.preadv(fd, pending, offset)
        if n == 0:
            raise EOFError(offset)
        offset += n
        while pending and n >= pending[0].nbytes:
            n -= pending[0].nbytes
            pending.pop(0)
        if n:
            pending[0] = pending[0][n:]


def _open(path: str) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        # Reads go in parallel but mostly forward: let the kernel read ahead.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _list(path: str) -> list[str] | None:
    if not os.path.isdir(path):
        return None
    return sorted(os.listdir(path))


class FileSource(Source):
    """Files on a local (or mounted) filesystem.

    Args:
        threads: the size of the reader thread pool, normally ``concurrency``.
    """

    def __init__(self, threads: int) -> None:
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="aioloader-read"
        )
        self._threads = threads
        self._started = False
        self._starter: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<FileSource threads={self._threads} open={self._executor is not None}>"

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            raise ClosedError("this FileSource is closed")
        if not self._started:
            self._started = True
            self._start_threads(self._executor)
        return self._executor

    def _start_threads(self, executor: ThreadPoolExecutor) -> None:
        """Start every reader thread now, before any data is read, off the event loop.

        The pool would otherwise start threads on demand in the middle of a load,
        and each start waits until the new thread has run: on a busy machine that
        wait stalled the event loop for tens of milliseconds. A short-lived helper
        thread fills the pool instead, all threads meeting at a barrier so that
        none is reused before the last has started.
        """
        count = self._threads
        barrier = threading.Barrier(count, timeout=30)

        def rendezvous() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

        def fill() -> None:
            for _ in range(count):
                try:
                    executor.submit(rendezvous)
                except RuntimeError:  # shut down meanwhile
                    barrier.abort()
                    return

        self._starter = threading.Thread(target=fill, name="aioloader-start", daemon=True)
        self._starter.start()

    async def list_dir(self, url: str) -> list[str] | None:
        path = to_path(url)
        try:
            return await run_blocking(self._pool(), lambda: _list(path))
        except OSError as exc:
            raise _translate(exc, url, "listing") from exc

    async def open(self, url: str) -> Blob:
        path = to_path(url)
        pool = self._pool()
        try:
            fd, size = await run_blocking(pool, lambda: _open(path), lambda r: os.close(r[0]))
        except IsADirectoryError as exc:
            raise SourceError(f"{url} is a directory where a file was expected") from exc
        except OSError as exc:
            raise _translate(exc, url, "opening") from exc
        return FileBlob(url, fd, size, pool)

    def join(self, base: str, name: str) -> str:
        if base.startswith("file://"):
            return base.rstrip("/") + "/" + name
        return os.path.join(base, name)

    def parent(self, url: str) -> str:
        if url.startswith("file://"):
            return url.rsplit("/", 1)[0]
        return str(Path(url).parent)

    async def aclose(self) -> None:
        executor, self._executor = self._executor, None
        if self._starter is not None:
            self._starter.join()
        if executor is not None:
            # Every read has returned by now (run_blocking waits for its thread),
            # so the workers are idle and joining them is immediate.
            executor.shutdown(wait=True)
