"""A range of a large file read from the origin straight into the cache entry's partial
file (``pull``; ranged.py), and the origin's file behind it (``OriginFile``).

A range is read in ``CHUNK`` bytes at a time at most, ``READS`` of them in flight at
most, each through ``gate``: the requests in flight this node may have to the origin
for its ranges (the cluster's cap shared out among the pullers, deal.py), whatever the
number of files and ranges it pulls at once. Each chunk is written at its offset with
``os.pwrite`` in a thread; the bytes read are reported as each chunk is written
(``progress``), which the node's manifest shows, so that its followers see it move.

A read is sized to take about ``PACE`` seconds at the rate the last one came (from
``FIRST`` bytes, between ``SMALLEST`` and ``CHUNK``): at 8 MiB a read, an origin that
sends 0.25 MB/s a request (a CDN throttling a greedy client) left a puller's manifest
unchanged for 32 s, its followers took it for stalled after ``--swarm-stall`` and read
the range from the origin themselves, which throttled it more.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from functools import partial
from pathlib import Path

from ..errors import ObjectChangedError
from ..runtime.direct_io import fill
from ..runtime.tasks import gather
from ..runtime.threads import run_blocking
from ..sources.base import Blob, Current, Source
from ..sources.digests import Running
from ..sources.opening import lean
from .counts import Reads

__all__ = ["CHUNK", "READS", "OriginFile", "pull", "sized", "whole_digest"]

CHUNK = 8 << 20
"""The largest origin read."""
FIRST = 1 << 20
"""The first read of a range, before its rate is known."""
SMALLEST = 256 << 10
"""The smallest read, however slow the origin."""
PACE = 2.0
"""Seconds a read should take at most at the last read's rate: the bytes read show in
the manifest at least that often (a fraction of any ``--swarm-stall``)."""
READS = 4
"""Reads of one range in flight at most (each also through the node's gate)."""


class OriginFile(Blob):
    """The origin's file at the version ``current``, opened at the first read, its reads
    counted as from the origin (a fetch that resumes a partial file reads it so)."""

    def __init__(self, origin: Source, url: str, name: str, current: Current, reads: Reads) -> None:
        self.origin, self.url, self.name, self.current, self.reads = (
            origin, url, name, current, reads,
        )  # fmt: skip
        self.size, self.etag, self.last_modified = current
        self._blob: Blob | None = None
        self._opening = asyncio.Lock()

    async def opened(self) -> Blob:
        """The origin's blob, opened once; ObjectChangedError where it changed."""
        async with self._opening:
            if self._blob is None:
                with lean():  # its probe's bytes: a range far from them is read here
                    blob = await self.origin.open(self.url)
                if Current(blob.size, blob.etag, blob.last_modified) != self.current:
                    await blob.aclose()
                    raise ObjectChangedError(
                        f"{self.url} changed at the origin while it was fetched; fetch it again"
                    )
                self._blob = blob
        return self._blob

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await (await self.opened()).read_into(offset, buffers)
        self.reads.from_origin(self.name, sum(b.nbytes for b in buffers))

    async def read_bytes(self, offset: int, length: int) -> bytes:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def aclose(self) -> None:
        if self._blob is not None:
            await self._blob.aclose()


async def pull(
    file: OriginFile,
    path: Path,
    offset: int,
    length: int,
    lane: Executor,
    gate: asyncio.Semaphore,
    progress: Callable[[int], None],
) -> None:
    """Read bytes ``[offset, offset + length)`` of ``file`` into the file at ``path`` at
    that offset; ``progress(n)`` after each chunk of ``n`` bytes written."""
    blob = await file.opened()
    loop = asyncio.get_running_loop()
    end = offset + length
    cursor, chunk = offset, FIRST
    fd = await run_blocking(lane, lambda: os.open(path, os.O_WRONLY), on_abandon=os.close)

    async def reader() -> None:
        nonlocal cursor, chunk
        buffer = bytearray(min(CHUNK, length))
        while cursor < end:
            at = cursor
            n = min(chunk, end - at)
            cursor += n
            view = memoryview(buffer)[:n]
            async with gate:
                began = loop.time()
                await blob.read_into(at, [view])
                chunk = sized(n, loop.time() - began)
            await run_blocking(lane, partial(_pwrite, fd, view, at))
            file.reads.from_origin(file.name, n)
            progress(n)

    try:
        await gather(reader() for _ in range(min(READS, -(-length // FIRST))))
    finally:
        os.close(fd)


def sized(n: int, took: float) -> int:
    """The next read's size, after a read of ``n`` bytes that took ``took`` seconds: what
    that rate brings in ``PACE`` seconds, a power of two from ``SMALLEST`` to ``CHUNK``."""
    want = n * PACE / max(took, 1e-6)
    size = SMALLEST
    while size * 2 <= min(want, CHUNK):
        size *= 2
    return size


def _pwrite(fd: int, view: memoryview, at: int) -> None:
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], at + done)


def whole_digest(path: Path, size: int, running: Running) -> str:
    """``running`` fed the ``size`` bytes of the file at ``path`` in order, and its
    result (blocking)."""
    view = memoryview(bytearray(min(CHUNK, max(size, 1))))
    with open(path, "rb") as file:
        at = 0
        while at < size:
            n = min(CHUNK, size - at)
            fill(file.fileno(), view, at, n)
            running.update(view[:n])
            at += n
    return running.result()
