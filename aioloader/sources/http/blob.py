"""One remote file, read by range GETs pinned to the version seen when it was opened.

Every range carries ``If-Match`` with the file's ETag (or ``If-Unmodified-Since``),
so a file replaced mid-load fails the load instead of mixing tensors from two
versions. A file whose server ignores ``Range`` is read as one sequential stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from ...errors import ClosedError
from ...runtime.pace import quantum, take
from ...runtime.prefault import populate
from ...runtime.threads import run_blocking
from ..base import Blob, clip
from .filler import Filler
from .retry import Retrier, RetryableError, keep_pace
from .rules import (
    check_encoding,
    check_same_etag,
    check_same_range,
    check_small_read,
    pin_headers,
)
from .transport import HttpTransport, retryable, transport_errors

__all__ = ["HttpBlob"]


class HttpBlob(Blob):
    """One remote file, pinned to the version seen when it was opened.

    Args:
        transport: sends the requests.
        retrier: retries them.
        url: the URL asked for, as shown to users.
        fetch_url: where the file was found (after redirects).
        size: its length in bytes.
        etag: its strong ETag, if the server gave one.
        last_modified: its ``Last-Modified``, if the server gave one.
        head: its first bytes, read when it was opened.
        ranged: the server honours ``Range``.
        fault_lane: the threads that fault in fresh tensor memory (prefault.py).
    """

    def __init__(
        self,
        transport: HttpTransport,
        retrier: Retrier,
        url: str,
        fetch_url: str,
        size: int,
        etag: str | None,
        last_modified: str | None,
        head: bytes,
        ranged: bool,
        fault_lane: Executor,
    ) -> None:
        self.url = url
        self.fetch_url = fetch_url
        self.size = size
        self.etag = etag
        self.last_modified = last_modified
        self._transport = transport
        self._retrier = retrier
        self._head = head
        self._ranged = ranged
        self._fault_lane = fault_lane
        self._closed = False
        # Sequential mode (server ignores Range): one open response and its position.
        self._stream_lock = asyncio.Lock()
        self._stream: Any = None
        self._stream_pos = 0

    def __repr__(self) -> str:
        return f"<HttpBlob {self.url!r} size={self.size} etag={self.etag} ranged={self._ranged}>"

    def pin_headers(self) -> dict[str, str]:
        """The headers that make a request fail once the file has changed."""
        return pin_headers(self.etag, self.last_modified)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        if offset + length <= len(self._head):
            return self._head[offset : offset + length]
        check_small_read(self.url, self.size, offset, length)
        buffer = bytearray(length)
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        if self._closed:
            raise ClosedError(f"{self.url} was already closed")
        filler = Filler(clip(buffers, self.size - offset))
        if filler.total == 0:
            return
        end = offset + filler.total
        if end <= len(self._head):
            filler.write(self._head[offset:end])
            return
        if self._ranged and offset < len(self._head):
            # The probe read the start of this range already: only the rest is asked for
            # (_fetch_range starts where the filler stands), so no byte comes twice.
            filler.write(self._head[offset:])
        await take(filler.remaining)  # a paced fetch's bytes (pace.py): before the request

        def progress() -> int:
            return filler.written

        # Fresh tensor memory is faulted in by a thread while the request travels,
        # not page by page inside the loop's recv (see prefault.py).
        populating = asyncio.ensure_future(
            run_blocking(self._fault_lane, lambda: populate(buffers))
        )
        try:
            if self._ranged:
                await self._retrier.run(
                    self.url, offset, end, lambda: self._fetch_range(offset, filler), progress
                )
            else:
                async with self._stream_lock:
                    await self._retrier.run(
                        self.url,
                        offset,
                        end,
                        lambda: self._read_sequential(offset, filler),
                        progress,
                    )
        finally:
            await populating

    def _check_version(self, start: int) -> Callable[[int, Mapping[str, str]], None]:
        def check(status: int, headers: Mapping[str, str]) -> None:
            check_same_range(self.url, self.size, self.etag, status, headers, start)

        return check

    async def _fetch_range(self, offset: int, filler: Filler) -> None:
        start = offset + filler.written
        last = offset + filler.total - 1
        headers = {"Range": f"bytes={start}-{last}", **self.pin_headers()}
        transport = self._transport
        check_version = self._check_version(start)
        if await transport.get_into(
            self.url, self.fetch_url, headers, filler, self.etag, check_version
        ):
            return
        try:
            response = await transport.get(self.url, self.fetch_url, headers)
            async with response:
                await transport.check_status(self.url, response, self.etag)
                check_encoding(self.url, response.headers)
                check_version(response.status, response.headers)
                pace = self._retrier.pace(filler.written)
                while filler.remaining:
                    chunk = await response.content.readany()
                    if not chunk:
                        raise RetryableError(
                            f"body ended after {filler.written} of {filler.total} bytes"
                        )
                    filler.write(chunk)
                    keep_pace(pace, filler.written)
        except transport_errors() as exc:
            raise retryable(exc) from exc

    async def _read_sequential(self, offset: int, filler: Filler) -> None:
        position = offset + filler.written
        try:
            if self._stream is None or self._stream_pos > position:
                await self._close_stream()
                self._stream = await self._open_stream()
                self._stream_pos = 0
            content = self._stream.content
            pace = self._retrier.pace(self._stream_pos)
            while self._stream_pos < position:
                # Bytes skipped to reach ``position`` cross the network as any others (a
                # stream opened again after a failure reads its start again): a paced
                # fetch takes them too (pace.py), a quantum at a time, before each read.
                step = min(position - self._stream_pos, quantum(1 << 20))
                await take(step)
                skipped = await content.read(step)
                if not skipped:
                    raise RetryableError(f"stream ended at byte {self._stream_pos}")
                self._stream_pos += len(skipped)
                keep_pace(pace, self._stream_pos)
            while filler.remaining:
                chunk = await content.read(min(filler.remaining, 1 << 20))
                if not chunk:
                    raise RetryableError(f"stream ended at byte {self._stream_pos}")
                filler.write(chunk)
                self._stream_pos += len(chunk)
                keep_pace(pace, self._stream_pos)
        except RetryableError:
            await self._close_stream()
            raise
        except transport_errors() as exc:
            await self._close_stream()
            raise retryable(exc) from exc

    async def _open_stream(self) -> Any:
        response = await self._transport.get(self.url, self.fetch_url, self.pin_headers())
        try:
            await self._transport.check_status(self.url, response, self.etag)
            check_encoding(self.url, response.headers)
            check_same_etag(self.url, self.etag, response.headers)
        except BaseException:
            response.close()
            raise
        return response

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    async def aclose(self) -> None:
        self._closed = True
        await self._close_stream()
