"""A model's files read from the swarm, the origin behind it (``SwarmSource``).

A node that leads (``follow`` is None) reads the origin, and notes each file it opens
in its own manifest, so that its followers see the files' sizes and versions at once.
A node that follows another reads each file from the swarm: it waits (bounded) for
the file's torrent in the followed node's manifest, downloads it into a scratch
folder ``<cache>/.swarm/incoming/<info hash>/`` and hands out byte ranges as their
pieces arrive, checked by libtorrent. A piece hash only says the bytes are the
followed node's: where the origin publishes a digest of the file (the Hub's LFS
sha256 or git blob id, S3's full-object checksum: ``Source.publisher_digest``), the
whole scratch copy is hashed and compared before its first byte is handed out, and
a copy that differs is a ``DigestMismatchError``: nothing of it reaches the cache,
and the coordinator turns to another node or to the origin. The cache then writes
the bytes into its entry and checks them there as for any download (its checksum,
the ETag or checksum ``object_checksums`` of the origin gives). The scratch copy
goes once the entry is committed.

Every byte is counted as from the origin or from the peers (``Reads``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..direct_io import fill
from ..errors import DigestMismatchError
from ..sources.base import Blob, ForwardingBlob, Source
from ..sources.digests import Digest
from ..threads import run_blocking
from .manifest import FileOffer, file_name
from .session import Download, Swarm

__all__ = ["Follow", "Reads", "SwarmSource"]


class Follow(Protocol):
    """The node a fetch follows (coordinator.py): its files, as its manifest shows them."""

    async def offer(self, name: str) -> FileOffer:
        """The file ``name``, once the manifest lists it (SwarmStalled: it did not)."""

    async def torrent(self, name: str) -> bytes:
        """The file's torrent, once the node holds the file (SwarmStalled: not in time)."""

    def swarm_peers(self) -> list[tuple[str, int]]:
        """Swarm addresses to download from."""


@dataclass
class Reads:
    """Bytes of one model read from the origin and from peers."""

    origin: int = 0
    peers: int = 0


class _OriginBlob(ForwardingBlob):
    def __init__(self, inner: Blob, reads: Reads) -> None:
        super().__init__(inner)
        self.reads = reads

    async def read_bytes(self, offset: int, length: int) -> bytes:
        data = await self.inner.read_bytes(offset, length)
        self.reads.origin += len(data)
        return data

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self.inner.read_into(offset, buffers)
        self.reads.origin += sum(b.nbytes for b in buffers)


class _SwarmBlob(Blob):
    """One file of a followed node, read from its torrent as pieces arrive."""

    def __init__(
        self, source: SwarmSource, url: str, offer: FileOffer, digest: Digest | None
    ) -> None:
        self.source = source
        self.digest = digest
        self.url = url
        self.name = offer.name
        self.size = offer.size
        self.etag = offer.etag
        self.last_modified = offer.last_modified
        self._download: Download | None = None
        self._fd: int | None = None
        self._checked = False
        self._turn = asyncio.Lock()

    async def _ready(self) -> Download:
        """The download, whole on disk and checked against the publisher's digest."""
        async with self._turn:
            if self._download is None:
                follow, swarm = self.source.follow, self.source.swarm
                assert follow is not None
                torrent = await follow.torrent(self.name)
                from .torrents import info_hash

                folder = self.source.scratch / info_hash(torrent)
                self._download = await swarm.download(torrent, folder, follow.swarm_peers())
                self._fd = await run_blocking(
                    self.source.lane, lambda: _open_when_made(self._download)
                )
            if not self._checked:
                await self._download.wait_range(0, self.size)  # the whole file, flushed
                if self.digest is not None:
                    await self._check(self.digest)
                self._checked = True
        return self._download

    async def _check(self, digest: Digest) -> None:
        running = digest.running()
        if running is None:  # a CRC whose library is missing: the cache's checks remain
            return
        fd, size = self._fd, self.size
        assert fd is not None

        def hashed() -> str:
            view = memoryview(bytearray(_BLOCK))
            at = 0
            while at < size:
                n = min(_BLOCK, size - at)
                try:
                    fill(fd, view, at, n)
                except EOFError as end:
                    raise OSError(f"short read of the swarm's copy at {end.args[0]}") from None
                running.update(view[:n])
                at += n
            return running.result()

        actual = await run_blocking(self.source.lane, hashed)
        if actual != digest.value:
            follow = self.source.follow
            raise DigestMismatchError(
                f"{self.url}: the copy from {follow!r} does not match the "
                f"{digest.algorithm} {digest.where}: expected {digest.value}, got {actual}. "
                "It is refused before a byte of it reaches the cache; the file comes from "
                "another node or from the origin",
                url=self.url,
                algorithm=digest.algorithm,
                expected=digest.value,
                actual=actual,
            )

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        download = await self._ready()
        length = sum(b.nbytes for b in buffers)
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

        await run_blocking(self.source.lane, read)
        self.source.reads.peers += length

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def aclose(self) -> None:
        download, self._download = self._download, None
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        if download is not None:
            await download.aclose()
            folder = download.path.parent
            await run_blocking(self.source.lane, lambda: shutil.rmtree(folder, ignore_errors=True))


_BLOCK = 8 << 20  # bytes hashed at a time


def _open_when_made(download: Download | None) -> int:
    assert download is not None
    download.path.parent.mkdir(parents=True, exist_ok=True)
    # libtorrent makes the file as pieces arrive; open it (sparse) to read them back.
    return os.open(download.path, os.O_RDONLY | os.O_CREAT, 0o600)


class SwarmSource(Source):
    """The files of one model: from a followed node's torrents, or from the origin.

    Args:
        origin: the URL's store (the origin).
        lane: the fetch's cache lane (scratch reads).
        swarm: the daemon's session.
        scratch: where downloads land before the cache copies them.
        reads: where bytes are counted.
        follow: the node followed (None: read the origin).
        noted: called with each file the origin opened (the leader's manifest).
    """

    def __init__(
        self,
        origin: Source,
        lane: Executor,
        swarm: Swarm,
        scratch: Path,
        reads: Reads,
        follow: Follow | None,
        noted: Callable[[FileOffer], None],
    ) -> None:
        self.origin = origin
        self.lane = lane
        self.swarm = swarm
        self.scratch = scratch
        self.reads = reads
        self.follow = follow
        self.noted = noted
        self.etag_is_md5 = origin.etag_is_md5

    def __repr__(self) -> str:
        return f"<SwarmSource follow={self.follow!r} origin={self.origin!r}>"

    async def list_dir(self, url: str) -> list[str] | None:
        return await self.origin.list_dir(url)

    async def open(self, url: str) -> Blob:
        name = file_name(url)
        if self.follow is not None:
            offer = await self.follow.offer(name)
            return _SwarmBlob(self, url, offer, await self.origin.publisher_digest(url))
        blob = await self.origin.open(url)
        self.noted(FileOffer(name, url, blob.size, blob.etag, blob.last_modified))
        return _OriginBlob(blob, self.reads)

    async def object_checksums(self, url: str) -> dict[str, str]:
        return await self.origin.object_checksums(url)

    async def publisher_digest(self, url: str) -> Digest | None:
        return await self.origin.publisher_digest(url)

    def join(self, base: str, name: str) -> str:
        return self.origin.join(base, name)

    def parent(self, url: str) -> str:
        return self.origin.parent(url)

    async def aclose(self) -> None:
        """Nothing of its own: the origin is its owner's to close."""
