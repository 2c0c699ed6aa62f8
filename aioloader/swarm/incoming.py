"""One file of a followed node coming through the swarm (``Incoming``).

Its download starts as soon as the file's torrent shows in the followed node's
manifest, whoever reads it and however many read slots its fetch has: every file of
the model comes at once, libtorrent sharing the links between them. It lands straight
in the cache's file for it (``landing``: the entry's ``data.partial``, made and sized
by the fetch that holds it), so each byte is written once and the page cache holds one
copy of it; a file read before its fetch asked for that (the index, read to plan the
fetch) or whose partial file is resumed lands in the scratch folder
``<cache>/.swarm/incoming/<node id>/<info hash>/`` instead, and the fetch copies it.
A byte range is there as soon as its pieces are checked (each against the torrent's
merkle tree) and written (download.py's ``wait_range``).

A piece hash only says the bytes are the followed node's. Where the origin publishes
a digest of the file (``Source.publisher_digest``: the Hub's LFS sha256, S3's
full-object checksum), a task hashes the file in order as its pieces arrive, reading
the scratch copy back (from the page cache), and ``checked()`` compares: a copy that
differs is a ``DigestMismatchError``. The cache's fetch discards what it wrote of it
and the coordinator turns to another node or to the origin.

A fetch's blobs of one file (the index is opened to find the shards, then fetched)
share one ``Incoming``; it goes, download and scratch copy, when the fetch ends; a
landing that a failed fetch leaves takes the download out first, so nothing writes
the file once its holder lets it go.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol, TypeVar

from ..errors import DigestMismatchError
from ..runtime.direct_io import fill
from ..runtime.threads import run_blocking
from ..sources.digests import Digest
from .download import Download, SwarmError
from .manifest import FileOffer
from .session import Swarm
from .torrents import describe, info_hash

__all__ = ["Follow", "Incoming"]

T = TypeVar("T")

_BLOCK = 8 << 20  # bytes hashed at a time


class Follow(Protocol):
    """The node a fetch follows (coordinator.py): its files, as its manifest shows them."""

    node: str  # its id
    api: str  # its daemon's API address

    async def offer(self, name: str) -> FileOffer:
        """The file ``name``, once the manifest lists it (SwarmStalled: it did not)."""

    async def torrent(self, name: str) -> bytes:
        """The file's torrent, once the node holds the file (SwarmStalled: not in time)."""

    def swarm_peers(self) -> list[tuple[str, int]]:
        """Swarm addresses to download from."""

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """``work``'s result, or a SwarmError once the node is gone (``work`` cancelled)."""

    @property
    def share(self) -> tuple[int, int] | None:
        """``(i, n)``: this node asks for the i-th n-th of each file's pieces first."""


class Incoming:
    """The swarm download of the file ``name`` of the followed node ``follow``.

    Args:
        follow: the node followed (its ``torrent(name)`` waits for the torrent).
        swarm: the daemon's session.
        scratch: where downloads land.
        lane: threads for reads and the hash.
        url: the file's URL (messages).
        name: the file's name in the manifest.
        size: its size in bytes.
        digest: what the origin publishes for it (None: nothing to compare).
    """

    def __init__(
        self,
        follow: Follow,
        swarm: Swarm,
        scratch: Path,
        lane: Executor,
        url: str,
        name: str,
        size: int,
        digest: Digest | None,
    ) -> None:
        self.follow = follow
        self.swarm = swarm
        self.scratch = scratch
        self.lane = lane
        self.url = url
        self.name = name
        self.size = size
        self.digest = digest
        self._fd: int | None = None
        self._download: Download | None = None
        self._scratch: Path | None = None  # the download's own folder, if it has one
        loop = asyncio.get_running_loop()
        # Where the download writes: the cache's file (``landing``), or the scratch
        # folder (None), decided by whoever comes first.
        self._target: asyncio.Future[Path | None] = loop.create_future()
        self._started = loop.create_task(self._start(), name=f"aioloader swarm {name}")
        self._hashed: asyncio.Task[str] | None = None
        if digest is not None and digest.running() is not None:
            self._hashed = loop.create_task(self._hash(digest), name=f"aioloader hash {name}")

    def __repr__(self) -> str:
        return f"<Incoming {self.name} from {self.follow!r}>"

    async def _start(self) -> Download:
        torrent = await self.follow.torrent(self.name)
        size = describe(torrent)[1]
        if size != self.size:  # the followed node has another version of the file now
            raise SwarmError(
                f"{self.url}: {self.follow!r} now offers {size} bytes of {self.name}, "
                f"not the {self.size} it listed"
            )
        target = await self._target
        folder = self.scratch / info_hash(torrent)
        download = await self.swarm.download(
            torrent, folder, self.follow.swarm_peers(), self.follow.share, into=target
        )
        self._download = download
        if target is None:
            self._scratch = folder
        self._fd = await run_blocking(
            self.lane, lambda: _open_sparse(download.path, target is None), on_abandon=os.close
        )
        return download

    @property
    def info_hash(self) -> str | None:
        """The download's info hash, once it started."""
        return self._download.info_hash if self._download is not None else None

    def _settle(self) -> None:
        """A read before any ``landing``: the download goes to the scratch folder."""
        if not self._target.done():
            self._target.set_result(None)

    @contextlib.asynccontextmanager
    async def landing(self, path: Path) -> AsyncIterator[bool]:
        """Download into ``path`` (the cache's file for it, made and sized) rather than a
        scratch copy: True, unless a read came first and the download writes its own
        copy (the index, read to plan the fetch). An exit by an error takes the download
        out of the session, its writes ended, before it returns: the file is its
        holder's again."""
        if not self._target.done():
            self._target.set_result(path)
        if self._target.result() != path:
            yield False
            return
        try:
            yield True
        except BaseException:
            await self._stop()
            raise

    async def download(self) -> Download:
        """The download, once started (the followed node published the torrent)."""
        return await asyncio.shield(self._started)

    async def ready(self, start: int, end: int) -> Download:
        """Return once bytes ``[start, end)`` are checked and written; a SwarmError once
        the followed node is gone."""
        self._settle()
        download = await self.follow.unless_gone(self.download())
        await self.follow.unless_gone(download.wait_range(start, end))
        return download

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> int:
        """Fill ``buffers`` from ``offset`` once their bytes came; the bytes read."""
        length = sum(b.nbytes for b in buffers)
        download = await self.ready(offset, offset + length)
        fd = self._fd
        assert fd is not None

        def read() -> None:
            at = offset
            for buffer in buffers:
                view = buffer.cast("B") if buffer.format != "B" else buffer
                try:
                    fill(fd, view, at, view.nbytes)
                except EOFError as end:
                    raise OSError(f"{download.path}: short read at {end.args[0]}") from None
                at += view.nbytes

        await run_blocking(self.lane, read)
        return length

    async def checked(self) -> None:
        """Return once the whole file matches the origin's digest (at once without one).

        Raises:
            DigestMismatchError: it does not.
        """
        if self._hashed is None or self.digest is None:
            return
        actual = await self.follow.unless_gone(asyncio.shield(self._hashed))
        digest = self.digest
        if actual != digest.value:
            raise DigestMismatchError(
                f"{self.url}: the copy from {self.follow!r} does not match the "
                f"{digest.algorithm} {digest.where}: expected {digest.value}, got {actual}. "
                "It is refused before the cache commits a byte of it; the file comes from "
                "another node or from the origin",
                url=self.url,
                algorithm=digest.algorithm,
                expected=digest.value,
                actual=actual,
            )

    async def _hash(self, digest: Digest) -> str:
        """The file's digest, hashed in order as its pieces arrive."""
        running = digest.running()
        assert running is not None
        download = await self.download()
        view = memoryview(bytearray(min(_BLOCK, max(self.size, 1))))
        at = 0
        while at < self.size:
            n = min(_BLOCK, self.size - at)
            await download.wait_range(at, at + n)
            fd = self._fd
            assert fd is not None

            def step(fd: int = fd, at: int = at, n: int = n) -> None:
                try:
                    fill(fd, view, at, n)
                except EOFError as end:
                    raise OSError(f"short read of the swarm's copy at {end.args[0]}") from None
                running.update(view[:n])

            await run_blocking(self.lane, step)
            at += n
        return running.result()

    async def aclose(self) -> None:
        """Stop the download and the hash, remove the scratch copy; idempotent."""
        await self._stop()
        folder, self._scratch = self._scratch, None
        if folder is not None:
            await run_blocking(self.lane, lambda: shutil.rmtree(folder, ignore_errors=True))

    async def _stop(self) -> None:
        """Stop the download (returns once it writes nothing more) and the hash."""
        tasks = [t for t in (self._started, self._hashed) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled():
                task.exception()  # seen: the readers had it, or nobody needs it now
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        download, self._download = self._download, None
        if download is not None:
            await download.aclose()


def _open_sparse(path: Path, make: bool) -> int:
    if not make:  # the cache's file, made by its holder
        return os.open(path, os.O_RDONLY)
    path.parent.mkdir(parents=True, exist_ok=True)
    # libtorrent makes the file as pieces arrive; open it (sparse) to read them back.
    return os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
