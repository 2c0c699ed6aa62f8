"""Stand-ins for peers that misbehave, on real sockets: ``serving(path, handlers)`` runs
each handler on a port of its own on 127.0.0.1 and yields their API addresses; what a
handler answers (late, garbage, a lie) is the test's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web

__all__ = ["HeldProxy", "serving"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serving(path: str, handlers: Sequence[Handler]) -> AsyncIterator[list[str]]:
    """``GET path`` answered by ``handlers[i]`` at the i-th address yielded."""
    runners: list[web.AppRunner] = []
    apis = []
    try:
        for handler in handlers:
            app = web.Application()
            app.router.add_get(path, handler)
            runner = web.AppRunner(app, shutdown_timeout=0.1)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            apis.append(f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
        yield apis
    finally:
        for runner in runners:
            await runner.cleanup()


class HeldProxy:
    """A TCP proxy on 127.0.0.1 to ``target`` (``host:port``) that takes connections and
    holds them unanswered for the first ``seconds`` (a busy daemon, as one asker sees
    it: the connection taken, no answer in time), then passes bytes both ways. A thread
    of its own; ``api`` is its address."""

    def __init__(self, target: str, seconds: float) -> None:
        import socket
        import threading
        import time

        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.until = time.monotonic() + seconds
        self._server = socket.create_server(("127.0.0.1", 0))
        self.api = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.held = 0  # connections held unanswered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="held proxy", daemon=True)
        self._thread.start()

    def hold(self, seconds: float) -> None:
        """Hold the connections taken from now on for ``seconds``."""
        import time

        self.until = time.monotonic() + seconds

    def __enter__(self) -> HeldProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(5)

    def _serve(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(client,), daemon=True).start()

    def _one(self, client: object) -> None:
        import select
        import socket
        import time

        assert isinstance(client, socket.socket)
        with client:
            wait = self.until - time.monotonic()
            if wait > 0:
                self.held += 1
                time.sleep(wait)  # taken, never answered: the asker times out and goes
                return
            with socket.create_connection(self.target, timeout=10) as upstream:
                ends = {client: upstream, upstream: client}
                while not self._stop.is_set():
                    ready, _, _ = select.select(list(ends), [], [], 0.5)
                    for end in ready:
                        data = end.recv(1 << 16)
                        if not data:
                            return
                        ends[end].sendall(data)
