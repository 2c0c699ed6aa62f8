"""The daemon's client connections: a cap, deadlines, and room for the probes.

A kubelet probe must be answered whatever other clients do, and a client that
opens connections and then sends nothing, or a header a byte at a time, would
otherwise hold a descriptor each until the process runs out (open files: 1024
by default) and the probes can no longer connect. So every connection is held
by a ``ConnectionGuard``:

- a deadline: a connection must deliver a whole request's headers within
  ``timeout`` seconds of connecting, or of its previous answer (an idle
  keep-alive connection is the same case), or it is closed; the body of a
  request is read under the same bound (app.py);
- a cap: at most ``cap`` connections at once. One more closes the connection
  that has been idle longest (no request being handled) to make room, so a new
  connection, a probe's included, is always taken; only when every held
  connection is in the middle of a request is the new one refused.
- the open-file limit: ``raise_open_files_limit`` lifts the soft limit to the
  hard one at startup, and ``fit_cap`` keeps the cap to half of what is left, the
  other half for downloads, cache files and the listener.

Which connections are busy is told by ``middleware``, the application's
outermost: a request in its handler. The bookkeeping is synchronous, on the
event loop, and never blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..redact import redacting_logger

__all__ = [
    "ConnectionGuard",
    "fit_cap",
    "raise_open_files_limit",
]

logger = redacting_logger(__name__)

_LOWEST_CAP = 16
# Seconds between two log lines about connections closed to make room.
_REPORT_EVERY = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def raise_open_files_limit() -> int | None:
    """Lift the soft limit of open files to the hard one; returns the soft limit now
    in effect (None where the platform has no such limit)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux or macOS
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit cannot be the soft one (the kernel's nr_open bounds it).
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return None if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError) as exc:
        logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, wanted, exc)
        return soft
    logger.info("open-file limit raised from %d to %d", soft, wanted)
    return wanted


def fit_cap(cap: int, open_files: int | None) -> int:
    """``cap``, lowered to half the open-file limit (and never below a few)."""
    if open_files is None:
        return cap
    room = max(_LOWEST_CAP, open_files // 2)
    if cap > room:
        logger.warning(
            "max connections lowered from %d to %d: the open-file limit is %d, and downloads "
            "need the rest; raise the limit (ulimit -n) to hold more",
            cap, room, open_files,
        )  # fmt: skip
        return room
    return cap


class _Connection(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, the guard's deadline around it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._made = False
        self.transport: Any = None  # an asyncio or uvloop transport
        self.busy = 0  # requests in their handler now
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self._guard.admit(self):
            self.transport.abort()
            return
        self._made = True
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._made:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._made else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        if self._made:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._made:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._made:
            self._inner.resume_writing()

    def close(self) -> None:
        """Drop the connection at once (its descriptor is freed now)."""
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        if self.transport is not None:
            self.transport.abort()


class ConnectionGuard:
    """Holds the daemon's connections under ``cap`` and their deadlines (see above).

    Args:
        cap: connections held at once.
        timeout: seconds to deliver a request's headers.

    Put ``guard.middleware`` first among the application's middlewares, and serve
    with ``loop.create_server(guard.protocols(runner.server), ...)``.
    """

    def __init__(self, cap: int, timeout: float) -> None:
        self.cap = cap
        self.timeout = timeout
        # Least recently active first: the front is the first to close for room.
        self._held: OrderedDict[Any, _Connection] = OrderedDict()
        self.closed_idle = 0  # connections closed to make room for a new one
        self.timed_out = 0  # connections closed at their deadline
        self.refused = 0  # new connections refused: every held one was busy
        self._reported = 0.0

    def __repr__(self) -> str:
        return (
            f"<ConnectionGuard {len(self._held)}/{self.cap} timeout={self.timeout} "
            f"timed_out={self.timed_out} closed_idle={self.closed_idle} refused={self.refused}>"
        )

    def __len__(self) -> int:
        return len(self._held)

    def protocols(self, factory: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        """The factory for ``create_server``: ``factory``'s protocols (aiohttp's
        ``AppRunner.server``), each held by this guard."""
        return lambda: _Connection(self, factory())

    def admit(self, conn: _Connection) -> bool:
        """Hold ``conn``, closing the longest idle one if the cap is reached."""
        if len(self._held) >= self.cap:
            idle = next((c for c in self._held.values() if not c.busy), None)
            if idle is None:
                self.refused += 1
                self._report()
                return False
            self._drop(idle)
            self.closed_idle += 1
            self._report()
        self._held[conn.transport] = conn
        self._arm(conn)
        return True

    def forget(self, conn: _Connection) -> None:
        if self._held.get(conn.transport) is conn:
            del self._held[conn.transport]
        if conn.deadline is not None:
            conn.deadline.cancel()
            conn.deadline = None

    def _drop(self, conn: _Connection) -> None:
        self.forget(conn)
        conn.close()

    def _arm(self, conn: _Connection) -> None:
        if conn.deadline is not None:
            conn.deadline.cancel()
        loop = asyncio.get_running_loop()
        conn.deadline = loop.call_later(self.timeout, self._expire, conn)

    def _expire(self, conn: _Connection) -> None:
        conn.deadline = None
        if not conn.busy and self._held.get(conn.transport) is conn:
            self.timed_out += 1
            self._drop(conn)

    def _report(self) -> None:
        now = time.monotonic()
        if now - self._reported >= _REPORT_EVERY:
            self._reported = now
            logger.log(
                logging.WARNING,
                "%d client connections held (the cap): idle ones are closed to make room "
                "(%d so far), and %d new ones were refused while every held one was busy; "
                "a client may be opening connections and sending nothing",
                len(self._held), self.closed_idle, self.refused,
            )  # fmt: skip

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Marks the request's connection busy while its handler runs."""
        conn = self._held.get(request.transport)
        if conn is None:
            return await handler(request)
        conn.busy += 1
        if conn.deadline is not None:
            conn.deadline.cancel()
            conn.deadline = None
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            if not conn.busy and self._held.get(conn.transport) is conn:
                self._held.move_to_end(conn.transport)  # active just now
                self._arm(conn)

    def close_all(self) -> None:
        """Drop every connection held (at shutdown, after the listener closed)."""
        for conn in list(self._held.values()):
            self._drop(conn)
