"""A minimal HTTP/1.1 range client whose response bodies land in the caller's memory.

For the hot path, one range GET per chunk of a model, this client sends the request
on a keep-alive connection that reads the body straight into the destination buffer
(connection.py). It does only that: keep-alive connections, a request with the
caller's (signed) headers, a ``206`` with ``Content-Length``, watched for stalls and
for a pace under ``min_speed``. Any other answer is handed back to the caller, who
repeats the request through aiohttp, which knows the rest of HTTP (errors, redirects,
chunked bodies, proxies).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from .connection import HEAD_LIMIT, Answer, Connection, WireError, content_length

__all__ = ["Answer", "Pace", "RangeClient", "WireError", "content_length"]

T = TypeVar("T")


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
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._closed = False

    async def _connect(self, scheme: str, host: str, port: int) -> Connection:
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
                    Connection, host, port, ssl=context, server_hostname=host if context else None
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

    async def _read_short_body(self, connection: Connection, answer: Answer) -> None:
        """Keep a short body of a refused answer (an error document) for the caller."""
        try:
            size = content_length(answer.headers.get("content-length"))
        except WireError:
            return  # the connection is dropped after a refusal anyway
        if size is None or not 0 < size <= HEAD_LIMIT:
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
        self, connection: Connection, future: asyncio.Future[T], pace: Pace | None = None
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

    async def aclose(self) -> None:
        """``close()``, as a Receiver closes (lanes.py)."""
        self.close()

    def close(self) -> None:
        """Drop the idle connections; one in use is dropped once its transfer ends."""
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.discard()
        self._idle.clear()
