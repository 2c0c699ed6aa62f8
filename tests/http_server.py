"""A real local HTTP file server for tests, with fault injection: ``FaultyHttpServer``.

It listens on 127.0.0.1 on a port the OS picks and runs in a background thread of its
own. A thread of its own means the server keeps answering while the test's event loop
is busy (or blocked), its CPU work never runs on the loop under test, and a subprocess
started by the test (the CLI, say) can reach it over TCP just like the test itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gzip
import re
import socket
import ssl
import struct
import termios
import threading
import time
from collections import Counter
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import NamedTuple, Self

from aiohttp import web

from .lifetime import StartStop

__all__ = ["FaultyHttpServer", "RequestRecord"]

CHUNK = 64 * 1024
"""Bodies go out in writes of this size, so a fault can strike in the middle of one."""


class RequestRecord(NamedTuple):
    """One request as the server saw it; ``range`` is the raw ``Range`` header or None."""

    method: str
    path: str
    range: str | None


@dataclass
class _Fault:
    """A one-shot misbehaviour for the next ``count`` GETs of ``path`` (None: any path)."""

    kind: str
    path: str | None
    count: int
    nbytes: int = 0
    seconds: float = 0.0
    before_headers: bool = False
    code: int = 500
    retry_after: float | None = None
    body: bytes = b""
    past: int = 0  # only GETs whose range starts at or after this byte

    def matches(self, path: str, start: int = 0) -> bool:
        return self.count > 0 and (self.path is None or self.path == path) and start >= self.past


@dataclass
class _Version:
    """Content version of one path, bumped by ``change_after``."""

    version: int = 0
    gets_until_change: int | None = None
    flip_from: int | None = None


@dataclass
class _Served:
    """What one GET/HEAD is to send, decided under the lock, used outside it."""

    file: Path
    size: int
    etag: str
    last_modified: str
    version: int
    flip_from: int
    fault: _Fault | None = None
    ignore_range: bool = False
    corrupt_at: int = -1


def _norm(path: str) -> str:
    """Paths are kept relative to the root, without the leading slash."""
    return path.lstrip("/")


def _data_start(file: Path) -> int:
    """Where a safetensors file's data region begins, or 0 for anything else.

    ``change_after`` flips bytes only from there on, so the changed object still parses:
    a client that does not check the ETag gets silently different tensors, not an error.
    """
    with contextlib.suppress(OSError), file.open("rb") as fh:
        head = fh.read(8)
        if len(head) == 8:
            start = 8 + int.from_bytes(head, "little")
            if start <= file.stat().st_size:
                return start
    return 0


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """One ``bytes=`` range resolved against ``size``.

    Returns (first, last) inclusive, None when the header is to be ignored (bad syntax or
    several ranges: RFC 9110 lets a server answer 200 then), or "unsatisfiable" for 416.
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first_s, sep, last_s = spec.strip().partition("-")
    if not sep:
        return None
    try:
        if first_s == "":  # suffix range: the last n bytes
            n = int(last_s)
            if n <= 0 or size == 0:
                return "unsatisfiable"
            return max(0, size - n), size - 1
        first = int(first_s)
        last = int(last_s) if last_s else size - 1
    except ValueError:
        return None
    if first >= size:
        return "unsatisfiable"
    if last < first:
        return None
    return first, min(last, size - 1)


def _etag_matches(header: str, etag: str) -> bool:
    """Strong comparison of an If-Match / If-Range list against the current ETag."""
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or etag in tags


class FaultyHttpServer(StartStop):
    """Serves files under ``root`` over HTTP/1.1, and misbehaves on request.

    Use as ``with FaultyHttpServer(root) as server:``. GET and HEAD honour single
    ``Range: bytes=`` requests (206 / 416), ``If-Match`` (412) and ``If-Range``, and every
    answer carries a strong ``ETag``, ``Last-Modified`` and ``Accept-Ranges: bytes``.

    Faults are set from the test thread while the server thread serves, so every
    configuration method takes the lock. One-shot faults (``reset_after``, ``short_body``,
    ``stall``, ``status``) act on GETs only: each GET consumes at most one, the earliest
    registered one that matches its path and has uses left. The other settings
    (``ignore_range``, ``change_after``, ``corrupt``, ``redirect``, ``require_header``,
    ``limit_concurrency``) last until changed or ``clear_faults()``.
    """

    def __init__(
        self, root: Path, *, chunk_size: int = CHUNK, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.root = Path(root).resolve()
        self.chunk_size = chunk_size
        self._ssl = ssl_context
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._versions: dict[str, _Version] = {}
        self._ignore_range: set[str | None] = set()
        self._redirects: dict[str, str] = {}
        self._redirect_all: str | None = None
        self._required: dict[str, str] = {}
        self._etags: dict[str, str] = {}
        self._corrupt: dict[str, int] = {}
        self._limit: tuple[int, int, float] | None = None
        self._log: list[tuple[RequestRecord, dict[str, str], str]] = []
        self._bytes_sent = 0
        self._active = 0
        self._admitted = 0
        self._max_concurrent = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server thread and wait until it listens."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # handed to start(), which re-raises it
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=main, name="faulty-http", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        app.router.add_route("HEAD", "/{tail:.*}", self._handle)
        # handler_cancellation: a handler stalled on purpose stops when its client leaves,
        # so it neither holds a file open nor counts as in flight afterwards.
        # shutdown_timeout: stop() must not wait a minute for a stalled handler.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        self._port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stop serving, cancel handlers still running and join the thread."""
        loop, runner, thread = self._loop, self._runner, self._thread
        if loop is None or thread is None:
            return
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._loop = self._runner = self._thread = None

    # -- addresses and counters -------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Base URL, without a trailing slash (https:// when given an ``ssl_context``)."""
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self._port}"

    def url_for(self, relpath: str | Path) -> str:
        """URL of a file given relative to ``root``."""
        return f"{self.url}/{_norm(Path(relpath).as_posix())}"

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request so far, in arrival order (a copy)."""
        with self._lock:
            return [rec for rec, _, _ in self._log]

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Headers of every request so far, parallel to ``requests`` (a copy)."""
        with self._lock:
            return [dict(h) for _, h, _ in self._log]

    @property
    def query_strings(self) -> list[str]:
        """The query string of every request so far, parallel to ``requests`` (a copy)."""
        with self._lock:
            return [q for _, _, q in self._log]

    def request_counts(self) -> Counter[tuple[str, str]]:
        """How many requests each (method, path) got."""
        return Counter((r.method, r.path) for r in self.requests)

    def gets(self, path: str | None = None) -> list[RequestRecord]:
        """The GET requests, of one path if given."""
        want = None if path is None else _norm(path)
        return [r for r in self.requests if r.method == "GET" and want in (None, r.path)]

    @property
    def bytes_sent(self) -> int:
        """Body bytes written to clients, over all responses."""
        with self._lock:
            return self._bytes_sent

    @property
    def max_concurrent(self) -> int:
        """Most GETs in flight at once, counting those about to be refused as throttled."""
        with self._lock:
            return self._max_concurrent

    @property
    def in_flight(self) -> int:
        """GETs being handled right now."""
        with self._lock:
            return self._active

    def reset_counters(self) -> None:
        """Forget requests, bytes sent and the concurrency high-water mark."""
        with self._lock:
            self._log.clear()
            self._bytes_sent = 0
            self._max_concurrent = self._active

    # -- fault configuration ----------------------------------------------------------

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def reset_after(self, path: str | None, nbytes: int, count: int = 1, *, past: int = 0) -> None:
        """Send headers and ``nbytes`` of body, then reset the connection (TCP RST).

        ``past``: only GETs whose range starts at or after this byte (not the first probe).
        """
        self._add(_Fault("reset", _opt(path), count, nbytes=nbytes, past=past))

    def encode(self, path: str | None, encoding: str = "gzip", count: int = 1) -> None:
        """Answer with the body compressed and ``Content-Encoding: <encoding>``, although
        the client asked for identity (as a misconfigured proxy or CDN does)."""
        self._add(_Fault("encode", _opt(path), count, body=encoding.encode()))

    def trickle(self, path: str | None, bytes_per_second: float, count: int = 1) -> None:
        """Send the body one byte at a time, ``bytes_per_second`` of them each second."""
        self._add(_Fault("trickle", _opt(path), count, seconds=1 / bytes_per_second))

    def pace(self, path: str | None, bytes_per_second: float, count: int = 1) -> None:
        """Send the body in the server's chunks, ``bytes_per_second`` each response: an
        origin that throttles each request (a CDN with a greedy client)."""
        self._add(_Fault("pace", _opt(path), count, seconds=1 / bytes_per_second))

    def short_body(self, path: str | None, count: int = 1) -> None:
        """Promise the full Content-Length, send half of it and close cleanly (FIN)."""
        self._add(_Fault("short", _opt(path), count))

    def stall(
        self,
        path: str | None,
        seconds: float,
        after_bytes: int = 0,
        count: int = 1,
        *,
        before_headers: bool = False,
        past: int = 0,
    ) -> None:
        """Send headers and ``after_bytes`` of body, then go quiet for ``seconds``.

        With ``before_headers`` the pause comes before the status line instead;
        ``past`` as for ``reset_after``.
        """
        self._add(
            _Fault(
                "stall",
                _opt(path),
                count,
                nbytes=after_bytes,
                seconds=seconds,
                before_headers=before_headers,
                past=past,
            )
        )

    def status(
        self,
        path: str | None,
        code: int,
        count: int = 1,
        retry_after: float | None = None,
        body: bytes = b"",
        *,
        past: int = 0,
    ) -> None:
        """Answer ``code`` (with ``Retry-After`` if given) instead of the file; ``past`` as
        for ``reset_after``."""
        self._add(
            _Fault(
                "status",
                _opt(path),
                count,
                code=code,
                retry_after=retry_after,
                body=body,
                past=past,
            )
        )

    def ignore_range(self, path: str | None, enabled: bool = True) -> None:
        """Answer 200 with the whole body even when a Range is asked, until disabled."""
        with self._lock:
            if enabled:
                self._ignore_range.add(_opt(path))
            else:
                self._ignore_range.discard(_opt(path))

    def change_after(self, path: str, requests: int, flip_from: int | None = None) -> None:
        """After ``requests`` more GETs of ``path``, its content changes.

        The file on disk stays as it is; the server bumps the path's version, which changes
        the ETag (so If-Match with the old one gets 412) and xors every served byte from
        ``flip_from`` on (default: the safetensors data region, else the whole file) with a
        version-dependent mask. ``requests=0`` changes it right away.
        """
        key = _norm(path)
        with self._lock:
            state = self._versions.setdefault(key, _Version())
            state.flip_from = flip_from
            if requests <= 0:
                state.version += 1
                state.gets_until_change = None
            else:
                state.gets_until_change = requests

    def corrupt(self, path: str, at: int) -> None:
        """Flip byte ``at`` of ``path`` in every body that carries it, keeping the ETag
        and everything else: storage (or a hop) that damages bytes silently. Lasts until
        ``clear_faults()``."""
        with self._lock:
            self._corrupt[_norm(path)] = at

    def version(self, path: str) -> int:
        """Current content version of ``path`` (0 until ``change_after`` fires)."""
        with self._lock:
            return self._versions.get(_norm(path), _Version()).version

    def redirect(self, from_path: str, to_path: str) -> None:
        """GET/HEAD of ``from_path`` answer 302 to ``to_path`` on this server (or to
        ``to_path`` itself when it is an absolute URL: another server)."""
        with self._lock:
            self._redirects[_norm(from_path)] = to_path if "://" in to_path else _norm(to_path)

    def redirect_all_to(self, other_url: str | None) -> None:
        """Every GET/HEAD answers 302 to the same path under ``other_url`` (None: stop)."""
        with self._lock:
            self._redirect_all = other_url.rstrip("/") if other_url else None

    def set_etag(self, path: str, etag: str | None) -> None:
        """Send ``etag`` as the ETag of ``path`` (None: the usual size-mtime-version one).

        Lasts until changed; ``clear_faults()`` leaves it.
        """
        with self._lock:
            if etag is None:
                self._etags.pop(_norm(path), None)
            else:
                self._etags[_norm(path)] = etag

    def require_header(self, name: str, value: str | None) -> None:
        """Requests without ``name: value`` get 401 (``value=None`` lifts the rule)."""
        with self._lock:
            if value is None:
                self._required.pop(name, None)
            else:
                self._required[name] = value

    def limit_concurrency(self, n: int | None, code: int = 503, retry_after: float = 0) -> None:
        """GETs beyond ``n`` in flight at once get ``code`` with Retry-After (None: no limit)."""
        with self._lock:
            self._limit = None if n is None else (n, code, retry_after)

    def clear_faults(self) -> None:
        """Drop every fault and setting (content versions stay as they are)."""
        with self._lock:
            self._faults.clear()
            self._ignore_range.clear()
            self._redirects.clear()
            self._redirect_all = None
            self._required.clear()
            self._limit = None
            self._corrupt.clear()
            for state in self._versions.values():
                state.gets_until_change = None

    # -- serving ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = _norm(request.path)
        is_get = request.method == "GET"
        record = RequestRecord(request.method, path, request.headers.get("Range"))
        with self._lock:
            self._log.append((record, dict(request.headers), request.query_string))
            if is_get:
                self._active += 1
                self._max_concurrent = max(self._max_concurrent, self._active)
        admitted = False
        try:
            answer = self._gate(request, path)
            if answer is not None:
                return answer
            if is_get:
                admitted = self._admit()
                if not admitted:
                    assert self._limit is not None
                    _, code, retry_after = self._limit
                    return _plain(code, retry_after=retry_after)
            return await self._respond(request, path)
        finally:
            with self._lock:
                if is_get:
                    self._active -= 1
                if admitted:
                    self._admitted -= 1

    def _admit(self) -> bool:
        with self._lock:
            if self._limit is not None and self._admitted >= self._limit[0]:
                return False
            self._admitted += 1
            return True

    def _gate(self, request: web.Request, path: str) -> web.StreamResponse | None:
        """Authorization and redirects, which apply before any file is looked at."""
        with self._lock:
            required = dict(self._required)
            target = self._redirects.get(path)
            redirect_all = self._redirect_all
        for name, value in required.items():
            if request.headers.get(name) != value:
                extra = {"WWW-Authenticate": "Bearer"} if name.lower() == "authorization" else {}
                return _plain(401, headers=extra)
        if redirect_all is not None:
            location = f"{redirect_all}/{path}"
            if request.query_string:
                location += "?" + request.query_string
            return web.Response(status=302, headers={"Location": location})
        if target is not None:
            location = target if "://" in target else f"{self.url}/{target}"
            return web.Response(status=302, headers={"Location": location})
        return None

    def _lookup(self, request: web.Request, path: str) -> _Served | None:
        """Stat the file, take this GET's fault and bump versions, all under the lock."""
        file = (self.root / path).resolve()
        if not file.is_relative_to(self.root) or not file.is_file():
            return None
        st = file.stat()
        with self._lock:
            state = self._versions.get(path)
            etag = self._etags.get(path)
            version = state.version if state else 0
            flip_from = state.flip_from if state and state.flip_from is not None else -1
            fault = None
            if request.method == "GET":
                start = _range_start(request.headers.get("Range"))
                fault = next((f for f in self._faults if f.matches(path, start)), None)
                if fault is not None:
                    fault.count -= 1
                    self._faults = [f for f in self._faults if f.count > 0]
                if state is not None and state.gets_until_change is not None:
                    # This GET still sees the old version; the ones after it the new one.
                    state.gets_until_change -= 1
                    if state.gets_until_change <= 0:
                        state.version += 1
                        state.gets_until_change = None
            ignore = path in self._ignore_range or None in self._ignore_range
            corrupt_at = self._corrupt.get(path, -1)
        if version and flip_from < 0:
            flip_from = _data_start(file)
        return _Served(
            file=file,
            size=st.st_size,
            etag=etag or f'"{st.st_size:x}-{st.st_mtime_ns:x}-v{version}"',
            # A new version is a new modification; one second per version keeps it visible
            # at HTTP-date resolution.
            last_modified=formatdate(st.st_mtime + version, usegmt=True),
            version=version,
            flip_from=flip_from,
            fault=fault,
            ignore_range=ignore,
            corrupt_at=corrupt_at,
        )

    async def _respond(self, request: web.Request, path: str) -> web.StreamResponse:
        served = self._lookup(request, path)
        if served is None:
            return _plain(404)
        fault = served.fault
        if fault is not None and fault.kind == "status":
            return _plain(fault.code, retry_after=fault.retry_after, body=fault.body)
        if fault is not None and fault.kind == "stall" and fault.before_headers:
            await asyncio.sleep(fault.seconds)

        headers = {
            "ETag": served.etag,
            "Last-Modified": served.last_modified,
            "Accept-Ranges": "bytes",
        }
        if_match = request.headers.get("If-Match")
        if if_match is not None and not _etag_matches(if_match, served.etag):
            return _plain(412, headers=headers)

        first, last, status = 0, served.size - 1, 200
        range_header = request.headers.get("Range")
        if_range = request.headers.get("If-Range")
        if if_range is not None and not _etag_matches(if_range, served.etag):
            range_header = None  # the client's copy is stale: send the whole new body
        if range_header is not None and not served.ignore_range:
            wanted = _parse_range(range_header, served.size)
            if wanted == "unsatisfiable":
                headers["Content-Range"] = f"bytes */{served.size}"
                return _plain(416, headers=headers)
            if isinstance(wanted, tuple):
                first, last = wanted
                status = 206
                headers["Content-Range"] = f"bytes {first}-{last}/{served.size}"

        if fault is not None and fault.kind == "encode":
            return self._encoded(served, first, last, status, headers, fault.body.decode())
        response = web.StreamResponse(status=status, headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = last - first + 1
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        return await self._send_body(request, response, served, first, last)

    def _encoded(
        self, served: _Served, first: int, last: int, status: int, headers: dict[str, str],
        encoding: str,
    ) -> web.StreamResponse:  # fmt: skip
        with served.file.open("rb") as fh:
            fh.seek(first)
            body = gzip.compress(fh.read(last - first + 1))
        with self._lock:
            self._bytes_sent += len(body)
        headers = {**headers, "Content-Encoding": encoding}
        return web.Response(
            status=status, body=body, headers=headers, content_type="application/octet-stream"
        )

    async def _send_body(
        self,
        request: web.Request,
        response: web.StreamResponse,
        served: _Served,
        first: int,
        last: int,
    ) -> web.StreamResponse:
        fault = served.fault
        total = last - first + 1
        # Where the body is cut short or paused, as a count of body bytes.
        cut = total
        if fault is not None and fault.kind in ("reset", "stall") and not fault.before_headers:
            cut = min(fault.nbytes, total)
        elif fault is not None and fault.kind == "short":
            cut = total // 2
        table = _xor_table(served.version)

        # Plain blocking reads: this loop belongs to the server alone and the files are
        # small and page-cached, so a thread pool would only add noise.
        with served.file.open("rb") as fh:
            fh.seek(first)
            sent = 0
            pending = fault
            while True:
                if pending is not None and sent == cut:
                    pending = None
                    if await self._at_cut(request, fault, at_end=sent == total):
                        return response
                if sent >= total:
                    break
                limit = cut if sent < cut else total
                if fault is not None and fault.kind == "trickle":
                    await asyncio.sleep(fault.seconds)
                    limit = sent + 1
                piece = fh.read(min(self.chunk_size, limit - sent))
                if not piece:
                    break  # the file shrank under us; the client sees a short body
                if table is not None:
                    piece = _flip(piece, first + sent, served.flip_from, table)
                if 0 <= served.corrupt_at - (first + sent) < len(piece):
                    at = served.corrupt_at - (first + sent)
                    piece = piece[:at] + bytes([piece[at] ^ 0xFF]) + piece[at + 1 :]
                await response.write(piece)
                sent += len(piece)
                with self._lock:
                    self._bytes_sent += len(piece)
                if fault is not None and fault.kind == "pace":
                    await asyncio.sleep(len(piece) * fault.seconds)
        await response.write_eof()
        return response

    async def _at_cut(self, request: web.Request, fault: _Fault | None, at_end: bool) -> bool:
        """Apply the fault once the body reached its cut; True when the response is over."""
        if fault is None:
            return False
        transport = request.transport
        if fault.kind == "stall":
            await _flushed(transport)
            await asyncio.sleep(fault.seconds)
            return False
        if fault.kind in ("reset", "short") and transport is not None:
            if at_end and fault.kind == "short":
                return False
            await _flushed(transport)
            if fault.kind == "reset":
                # SO_LINGER with a zero timeout turns close() into a RST, which the client
                # sees as "connection reset by peer" rather than a tidy end of stream.
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
            else:
                transport.close()
            # The handler ends here without write_eof(): aiohttp then drops the keep-alive
            # connection quietly, since the transport is already closing.
            raise _Hangup
        return False


class _Hangup(asyncio.CancelledError):
    """Ends a handler whose connection the server just cut on purpose.

    aiohttp treats a handler cancelled this way like a client that went away: no error
    log, no attempt to send a 500 on a connection that is already gone.
    """


def _range_start(header: str | None) -> int:
    """The first byte a ``Range: bytes=N-...`` header asks for (0 for none or a suffix)."""
    match = re.match(r"\s*bytes\s*=\s*(\d+)-", header or "")
    return int(match.group(1)) if match else 0


def _opt(path: str | None) -> str | None:
    return None if path is None else _norm(path)


def _xor_table(version: int) -> bytes | None:
    """Byte translation for a content version: none for 0, a non-zero xor mask otherwise."""
    if version == 0:
        return None
    mask = (version - 1) % 255 + 1
    return bytes(i ^ mask for i in range(256))


def _flip(piece: bytes, offset: int, flip_from: int, table: bytes) -> bytes:
    """Translate the part of ``piece`` (which starts at file ``offset``) past ``flip_from``."""
    start = max(0, flip_from - offset)
    if start >= len(piece):
        return piece
    return piece[:start] + piece[start:].translate(table)


async def _flushed(transport: asyncio.BaseTransport | None, limit_s: float = 2.0) -> None:
    """Wait until what was written left the transport and was acknowledged by the peer.

    Without this a reset could discard bytes still queued, and tests could not count
    on exactly ``nbytes`` arriving before it.
    """
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        pending = getattr(transport, "get_write_buffer_size", lambda: 0)()
        if pending == 0 and sock is not None:
            # TIOCOUTQ (SIOCOUTQ on sockets): bytes sent but not yet acked (Linux).
            with contextlib.suppress(OSError):
                raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
                pending = struct.unpack("i", raw)[0]
        if pending == 0:
            return
        await asyncio.sleep(0.001)


def _plain(
    code: int,
    *,
    retry_after: float | None = None,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> web.Response:
    """A small non-file answer (error, throttle, precondition failure)."""
    all_headers = dict(headers or {})
    if retry_after is not None:
        # Retry-After is in whole seconds (delta-seconds); round up so 0.5 is not 0.
        all_headers["Retry-After"] = str(int(-(-retry_after // 1)))
    return web.Response(status=code, body=body, headers=all_headers)
