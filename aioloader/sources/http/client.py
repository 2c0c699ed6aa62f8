"""A minimal HTTP/1.1 range client whose response bodies land in the caller's memory.

aiohttp hands a body over as ``bytes`` chunks, which then have to be copied into
the tensor: two copies and an object per chunk. For the hot path, one range GET
per chunk of a model, this client reads the socket with ``recv_into`` straight
into the destination buffer (asyncio's BufferedProtocol): the kernel's copy is
the only one. It does only that: keep-alive connections, a request with the
caller's (signed) headers, a ``206`` with ``Content-Length``. Any other answer
is handed back to the caller, who repeats the request through aiohttp, which
knows the rest of HTTP (errors, redirects, chunked bodies, proxies).

The framing it does read follows RFC 9112: interim ``1xx`` answers (``103 Early
Hints``) are skipped; a ``Content-Length`` given as a list, or on several lines,
counts only when every value is the same (RFC 9110 8.6); and an answer with both
``Transfer-Encoding`` and ``Content-Length`` is refused as a protocol error rather
than read either way (RFC 9112 6.3 calls it a sign of response splitting, and
aiohttp, which reads every other answer, refuses it too).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

__all__ = ["Answer", "Pace", "RangeClient", "WireError", "content_length"]

_HEAD_LIMIT = 64 * 1024
# 19 digits hold every length below 2**63; a longer one is no length anyone can send.
_LENGTH = re.compile(r"[0-9]{1,19}")
T = TypeVar("T")


class WireError(Exception):
    """The connection failed or the peer broke the protocol; the request may be retried."""

    def __init__(self, reason: str, *, timeout: bool = False, slow: bool = False) -> None:
        super().__init__(reason)
        self.timeout = timeout
        self.slow = slow


def content_length(value: str | None) -> int | None:
    """The body length a ``Content-Length`` value gives; None when there is none.

    A list of identical values (``65536, 65536``, or the same line sent twice) is
    taken as one, as RFC 9110 8.6 allows.

    Raises:
        WireError: the value is not a length, or the values differ.
    """
    if value is None:
        return None
    values = {v.strip() for v in value.split(",")}
    if not all(_LENGTH.fullmatch(v) for v in values):
        raise WireError(f"malformed Content-Length {value[:100]!r}")
    if len(values) > 1:
        raise WireError(
            f"conflicting Content-Length values {value[:100]!r}: the body's end is unknown"
        )
    return int(values.pop())


class Pace:
    """Fails a transfer that averages under ``min_speed`` bytes a second over a window.

    A stall timeout only catches silence; an upstream that trickles a byte now and
    then would hold a request (and the slot it occupies) forever.

    Args:
        min_speed: bytes per second; ``0`` never fails.
        window: seconds each average is taken over.
        done: the transfer's byte count when it starts.
    """

    def __init__(self, min_speed: int, window: float, done: int = 0) -> None:
        self._min_speed = min_speed
        self._window = window
        self._since = time.monotonic()
        self._mark = done

    def too_slow(self, done: int) -> str | None:
        """Given the running byte count: why the transfer is too slow, once a window closes."""
        now = time.monotonic()
        elapsed = now - self._since
        if not self._min_speed or elapsed < self._window:
            return None
        got = done - self._mark
        if got < self._min_speed * elapsed:
            return (
                f"{got} bytes in {elapsed:.1f} s, under the minimum of {self._min_speed} bytes/s "
                "(HttpOptions.min_speed)"
            )
        self._since, self._mark = now, done
        return None


@dataclass
class Answer:
    """Status and headers of a response (names lower-cased)."""

    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""  # the body of a refused answer, when short (error details)


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; the body of each response goes where ``sink`` says."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._head = bytearray(_HEAD_LIMIT)
        self._head_filled = 0
        self._in_body = False
        self._sink: Callable[[], memoryview] | None = None
        self._advance: Callable[[int], None] | None = None
        self._body_left = 0
        self._answer: asyncio.Future[Answer] | None = None
        self._done: asyncio.Future[None] | None = None
        self.reusable = True
        self.progress = 0  # bytes received, for stall detection
        # Between a response's headers and the caller taking its body, arriving
        # body bytes wait in the head buffer.
        self._holding = False

    # asyncio calls these ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._in_body and self._sink is not None and self._body_left:
            view = self._sink()
            return view[: self._body_left] if view.nbytes > self._body_left else view
        return memoryview(self._head)[self._head_filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.progress += nbytes
        if self._in_body:
            self._take_body(nbytes)
            return
        self._head_filled += nbytes
        if self._holding:
            if self._head_filled == len(self._head) and self.transport is not None:
                self.transport.pause_reading()
            return
        self._scan_head()

    def eof_received(self) -> bool:
        self._fail(WireError("server closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(WireError(f"connection lost: {exc}" if exc else "connection closed"))

    # ------------------------------------------------------------------------------------

    def _fail(self, error: WireError) -> None:
        self.reusable = False
        for future in (self._answer, self._done):
            if future is not None and not future.done():
                future.set_exception(error)
        if self.transport is not None:
            self.transport.abort()

    def discard(self) -> None:
        """Drop the connection; nobody waits for its pending answer any more."""
        self.reusable = False
        for future in (self._answer, self._done):
            if future is not None and not future.done():
                future.cancel()
        if self.transport is not None:
            self.transport.abort()

    def _scan_head(self) -> None:
        """Parse the heads in the buffer: interim (1xx) ones are dropped, the final one
        is handed to the caller."""
        while not self._holding:
            end = self._head.find(b"\r\n\r\n", 0, self._head_filled)
            if end < 0:
                if self._head_filled == len(self._head):
                    self._fail(WireError("response headers exceed 64 KiB"))
                return
            answer = self._parse_head(end)
            extra = bytes(self._head[end + 4 : self._head_filled])
            self._head[: len(extra)] = extra
            self._head_filled = len(extra)
            if answer is None:
                return
            if 100 <= answer.status < 200 and answer.status != 101:
                continue  # 100 Continue, 103 Early Hints: the real answer follows
            if answer.status == 101:
                self._fail(WireError("the server switched protocols (101) on a plain GET"))
                return
            self._holding = True
            assert self._answer is not None
            self._answer.set_result(answer)

    def _parse_head(self, end: int) -> Answer | None:
        lines = bytes(self._head[:end]).decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            # Lines of one name are one list (RFC 9110 5.3): a second Content-Length
            # must not silently replace the first.
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if not version.startswith("HTTP/1.") or not (code.isascii() and code.isdigit()):
            self._fail(WireError(f"malformed status line {lines[0][:100]!r}"))
            return None
        if version != "HTTP/1.1" or headers.get("connection", "").lower() == "close":
            self.reusable = False
        return Answer(int(code), reason, headers)

    def _take_body(self, nbytes: int) -> None:
        assert self._advance is not None
        self._advance(nbytes)
        self._body_left -= nbytes
        if self._body_left == 0 and self._done is not None and not self._done.done():
            self._in_body = False
            self._done.set_result(None)

    # used by RangeClient ----------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._answer = loop.create_future()
        self._done = None
        self.transport.write(request)
        return self._answer

    def receive_body(
        self, length: int, sink: Callable[[], memoryview], advance: Callable[[int], None]
    ) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._sink, self._advance, self._body_left = sink, advance, length
        early = bytes(self._head[: self._head_filled])
        self._head_filled = 0
        self._holding = False
        if len(early) > length:
            self._fail(WireError("server sent more bytes than the response announced"))
            return self._done
        position = 0
        while position < len(early):
            view = sink()
            n = min(view.nbytes, len(early) - position)
            view[:n] = early[position : position + n]
            position += n
            advance(n)
            self._body_left -= n
        if self._body_left == 0:
            self._done.set_result(None)
        else:
            self._in_body = True
        if self.transport is not None:
            self.transport.resume_reading()
        return self._done


class RangeClient:
    """Keep-alive connections per origin, for range GETs into caller buffers.

    Args:
        ssl_context: for https (``None``: the default trust store).
        connect_timeout: seconds to connect.
        stall_timeout: seconds without a byte before a transfer counts as stalled.
    """

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float,
        stall_timeout: float,
        min_speed: int = 0,
        speed_window: float = 30.0,
    ) -> None:
        self._ssl = ssl_context
        self._connect_timeout = connect_timeout
        self._stall_timeout = stall_timeout
        self._min_speed = min_speed
        self._speed_window = speed_window
        # How often a waiting transfer looks at its progress.
        self._tick = max(0.01, min(stall_timeout, speed_window) / 4)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._closed = False

    async def _connect(self, scheme: str, host: str, port: int) -> _Connection:
        key = (scheme, host, port)
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if (
                connection.reusable
                and connection.transport
                and not connection.transport.is_closing()
            ):
                return connection
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if scheme == "https":
            context = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await loop.create_connection(
                    _Connection, host, port, ssl=context, server_hostname=host if context else None
                )
        except (OSError, TimeoutError) as exc:
            raise WireError(
                f"cannot connect to {host}:{port}: {exc}", timeout=isinstance(exc, TimeoutError)
            ) from exc
        return protocol

    async def get_into(
        self,
        url: str,
        headers: dict[str, str],
        length: int,
        sink: Callable[[], memoryview],
        advance: Callable[[int], None],
        accept: Callable[[Answer], bool],
    ) -> Answer | None:
        """GET ``url``; if ``accept`` approves the answer, put ``length`` body bytes into ``sink``.

        Returns:
            ``None`` when the body was received in full; the Answer when ``accept``
            refused it (the connection is then dropped and the caller may repeat the
            request another way).

        Raises:
            WireError: connection failure, stall or protocol violation (bytes that
                did arrive have been passed to ``advance``).
        """
        parts = urlsplit(url)
        scheme = parts.scheme
        port = parts.port or (443 if scheme == "https" else 80)
        host = parts.hostname or ""
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}"]
        lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "host"]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

        connection = await self._connect(scheme, host, port)
        ok = False
        try:
            answer = await self._stalling(connection, connection.send(request))
            framed = "transfer-encoding" in answer.headers
            if not accept(answer):
                if not framed:
                    await self._read_short_body(connection, answer)
                return answer
            size = content_length(answer.headers.get("content-length"))
            if framed and size is not None:
                raise WireError(
                    "the 206 answer carries both Transfer-Encoding and Content-Length, which "
                    "RFC 9112 (6.3) treats as an error (the body's framing is ambiguous); it "
                    "was refused and nothing of it was kept: fix the server or the proxy"
                )
            if size != length:
                # Chunked, or another length: aiohttp reads it and the caller checks it.
                return answer
            pace = Pace(self._min_speed, self._speed_window, connection.progress)
            await self._stalling(connection, connection.receive_body(length, sink, advance), pace)
            ok = True
            return None
        finally:
            if ok and connection.reusable and not self._closed:
                self._idle.setdefault((scheme, host, port), []).append(connection)
            else:
                connection.discard()

    async def _read_short_body(self, connection: _Connection, answer: Answer) -> None:
        """Keep a short body of a refused answer (an error document) for the caller."""
        try:
            size = content_length(answer.headers.get("content-length"))
        except WireError:
            return  # the connection is dropped after a refusal anyway
        if size is None or not 0 < size <= _HEAD_LIMIT:
            return
        body = bytearray(size)
        filled = 0

        def sink() -> memoryview:
            return memoryview(body)[filled:]

        def advance(n: int) -> None:
            nonlocal filled
            filled += n

        try:
            await self._stalling(connection, connection.receive_body(size, sink, advance))
        except WireError:
            return
        answer.body = bytes(body)

    async def _stalling(
        self, connection: _Connection, future: asyncio.Future[T], pace: Pace | None = None
    ) -> T:
        """Wait for ``future``, failing when no byte arrives for ``stall_timeout``, or
        when ``pace`` finds the bytes arriving too slowly."""
        seen = connection.progress
        last_byte = time.monotonic()
        while True:
            done, _ = await asyncio.wait([future], timeout=self._tick)
            if done:
                return future.result()
            now = time.monotonic()
            if connection.progress != seen:
                seen, last_byte = connection.progress, now
            elif now - last_byte >= self._stall_timeout:
                connection.reusable = False
                future.cancel()
                raise WireError(
                    f"no data for {self._stall_timeout:g} s (stall timeout)", timeout=True
                )
            slow = pace.too_slow(connection.progress) if pace is not None else None
            if slow is not None:
                connection.reusable = False
                future.cancel()
                raise WireError(slow, timeout=True, slow=True)

    def close(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.discard()
        self._idle.clear()
