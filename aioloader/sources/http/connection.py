"""One keep-alive HTTP/1.1 connection whose response bodies land in the caller's memory.

aiohttp hands a body over as ``bytes`` chunks, which then have to be copied into
the tensor: two copies and an object per chunk. This connection reads the socket
with ``recv_into`` straight into the destination buffer (asyncio's BufferedProtocol):
the kernel's copy is the only one. The range client (client.py) owns the connections
and decides what to do with each answer.

The framing it reads follows RFC 9112: interim ``1xx`` answers (``103 Early
Hints``) are skipped; a ``Content-Length`` given as a list, or on several lines,
counts only when every value is the same (RFC 9110 8.6); and an answer with both
``Transfer-Encoding`` and ``Content-Length`` is refused as a protocol error rather
than read either way (RFC 9112 6.3 calls it a sign of response splitting, and
aiohttp, which reads every other answer, refuses it too).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["HEAD_LIMIT", "Answer", "Connection", "WireError", "content_length"]

#: The most bytes a response's head (status line and headers) may take.
HEAD_LIMIT = 64 * 1024
# 19 digits hold every length below 2**63; a longer one is no length anyone can send.
_LENGTH = re.compile(r"[0-9]{1,19}")


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


@dataclass
class Answer:
    """Status and headers of a response (names lower-cased)."""

    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""  # the body of a refused answer, when short (error details)


class Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; the body of each response goes where ``sink`` says."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._head = bytearray(HEAD_LIMIT)
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
