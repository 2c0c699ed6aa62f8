"""An HTTP origin for fleet tests and the fleet benchmark: ``Origin``.

It serves the files under a folder over HTTP/1.1 (GET and HEAD, single ``Range:
bytes=`` requests, a strong ``ETag``, ``Last-Modified``, ``If-Match`` and ``If-Range``),
and counts the body bytes it sends: in total, per path and per client address (each
node of a fleet in its own network namespace has an address of its own; on loopback
they all arrive from 127.0.0.1). An aiohttp server on a thread of its own with its own
event loop, so that it keeps serving whatever the caller's thread does; bodies go out
in 1 MiB writes, each counted as it is handed to the transport.

Faults: ``pause()``/``resume()`` (bodies stop at their next write, new requests wait),
``hold_after(n)`` (pause by itself once ``n`` body bytes went out in total),
``kill()``/``revive()`` (the listener closes and every connection is cut; then it
listens again on the same port) and ``corrupt(path, at)`` (byte ``at`` of ``path`` is
flipped in every body that carries it).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections import Counter
from email.utils import formatdate
from pathlib import Path
from typing import NamedTuple, Self

from aiohttp import web

__all__ = ["Origin", "Served"]

CHUNK = 1 << 20


class Served(NamedTuple):
    """One request as the origin answered it; ``nbytes``: body bytes sent."""

    method: str
    path: str
    range: str | None
    client: str
    status: int
    nbytes: int


class Origin:
    """``with Origin(root) as origin:`` serves ``root`` on ``host`` (port: the OS picks)."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = Path(root).resolve()
        self.host = host
        self._port = port
        self._lock = threading.Lock()
        self._served: list[Served] = []
        self._by_path: Counter[str] = Counter()
        self._by_client: Counter[str] = Counter()
        self._total = 0
        self._hold_at: int | None = None
        self._corrupt: dict[str, set[int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._open: asyncio.Event | None = None  # cleared while paused

    def __repr__(self) -> str:
        return f"<Origin {self.url} served={self.bytes_total} paused={self.paused}>"

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> Self:
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._open = asyncio.Event()
                self._open.set()
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # handed to start(), which raises it
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=main, name="fleet-origin", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self.resume()
        self._call(self._close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        """Close the listener and cut every connection, as an origin that went away."""
        self._call(self._close())

    def revive(self) -> None:
        """Listen again, on the same port."""
        self._call(self._listen())

    async def _listen(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        app.router.add_route("HEAD", "/{tail:.*}", self._handle)
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.2
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port, reuse_address=True, backlog=512)
        await site.start()
        self._runner = runner
        self._port = runner.addresses[0][1]

    async def _close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def _call(self, coro: object) -> None:
        assert self._loop is not None, "the origin is not started"
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=15)  # type: ignore[arg-type]

    # -- addresses and counters -------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def url_for(self, relpath: str | Path) -> str:
        return f"{self.url}/{Path(relpath).as_posix().lstrip('/')}"

    @property
    def bytes_total(self) -> int:
        """Body bytes sent so far, over every response."""
        with self._lock:
            return self._total

    def bytes_by_path(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_path)

    def bytes_by_client(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_client)

    @property
    def served(self) -> list[Served]:
        """Every finished request so far, in the order they ended (a copy)."""
        with self._lock:
            return list(self._served)

    def reset_counters(self) -> None:
        with self._lock:
            self._served.clear()
            self._by_path.clear()
            self._by_client.clear()
            self._total = 0

    # -- faults -----------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._open is not None and not self._open.is_set()

    def pause(self) -> None:
        if self._loop is not None and self._open is not None:
            self._loop.call_soon_threadsafe(self._open.clear)

    def resume(self) -> None:
        with self._lock:
            self._hold_at = None
        if self._loop is not None and self._open is not None:
            self._loop.call_soon_threadsafe(self._open.set)

    def hold_after(self, nbytes: int) -> None:
        """Pause once ``nbytes`` body bytes went out in total (counting from now on)."""
        with self._lock:
            self._hold_at = self._total + nbytes

    def corrupt(self, path: str, *offsets: int) -> None:
        """Flip the bytes at ``offsets`` of ``path`` in every body that carries them."""
        with self._lock:
            self._corrupt.setdefault(path.lstrip("/"), set()).update(offsets)

    def clear_faults(self) -> None:
        with self._lock:
            self._corrupt.clear()
        self.resume()

    # -- serving ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._open is not None
        await self._open.wait()
        path = request.match_info["tail"]
        file = (self.root / path).resolve()
        if not file.is_relative_to(self.root) or not file.is_file():
            return self._done(request, path, web.Response(status=404), 0)
        st = file.stat()
        size = st.st_size
        headers = {
            "ETag": f'"{size:x}-{st.st_mtime_ns:x}"',
            "Last-Modified": formatdate(st.st_mtime, usegmt=True),
            "Accept-Ranges": "bytes",
        }
        if_match = request.headers.get("If-Match")
        if if_match is not None and not _matches(if_match, headers["ETag"]):
            return self._done(request, path, web.Response(status=412, headers=headers), 0)
        first, last, status = 0, size - 1, 200
        wanted = request.headers.get("Range")
        if_range = request.headers.get("If-Range")
        if if_range is not None and not _matches(if_range, headers["ETag"]):
            wanted = None
        span = _range(wanted, size) if wanted else None
        if span == "unsatisfiable":
            headers["Content-Range"] = f"bytes */{size}"
            return self._done(request, path, web.Response(status=416, headers=headers), 0)
        if isinstance(span, tuple):
            first, last = span
            status = 206
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = last - first + 1
        await response.prepare(request)
        sent = 0
        try:
            if request.method == "GET":
                sent = await self._body(response, file, path, first, last + 1, _client(request))
                await response.write_eof()
        finally:
            self._done(request, path, response, sent)
        return response

    async def _body(
        self, response: web.StreamResponse, file: Path, path: str, start: int, end: int, client: str
    ) -> int:
        assert self._open is not None
        with self._lock:
            flips = sorted(self._corrupt.get(path, ()))
        fd = os.open(file, os.O_RDONLY)
        sent = 0
        try:
            while start + sent < end:
                await self._open.wait()
                offset = start + sent
                # The origin's own loop: a read of the page cache is brief, and a thread
                # pool would only add noise to what is measured.
                piece = os.pread(fd, min(CHUNK, end - offset), offset)
                if not piece:
                    break
                hits = [at - offset for at in flips if 0 <= at - offset < len(piece)]
                if hits:
                    buf = bytearray(piece)
                    for at in hits:
                        buf[at] ^= 0xFF
                    piece = bytes(buf)
                # Counted before the write: a client that has its bytes may look at the
                # count before this coroutine runs again; a write that fails is undone.
                self._count(path, client, len(piece))
                try:
                    await response.write(piece)
                except BaseException:
                    self._count(path, client, -len(piece))
                    raise
                sent += len(piece)
        finally:
            os.close(fd)
        return sent

    def _count(self, path: str, client: str, nbytes: int) -> None:
        with self._lock:
            self._total += nbytes
            self._by_path[path] += nbytes
            self._by_client[client] += nbytes
            hold = self._hold_at is not None and self._total >= self._hold_at
            if hold:
                self._hold_at = None
        if hold and self._open is not None:
            self._open.clear()  # on the origin's loop: this is called from a handler

    def _done(
        self,
        request: web.Request,
        path: str,
        response: web.StreamResponse,
        nbytes: int,
    ) -> web.StreamResponse:
        record = Served(
            request.method, path, request.headers.get("Range"), _client(request),
            response.status, nbytes,
        )  # fmt: skip
        with self._lock:
            self._served.append(record)
        return response


def _client(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return str(peer[0]) if peer else "?"


def _matches(header: str, etag: str) -> bool:
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or etag in tags


def _range(header: str, size: int) -> tuple[int, int] | str | None:
    """A single ``bytes=`` range as (first, last) inclusive; None: ignore it (send 200)."""
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first_s, last_s = match.groups()
    if first_s == "":
        n = int(last_s)
        return "unsatisfiable" if n <= 0 or size == 0 else (max(0, size - n), size - 1)
    first = int(first_s)
    last = int(last_s) if last_s else size - 1
    if first >= size:
        return "unsatisfiable"
    if last < first:
        return None
    return first, min(last, size - 1)
