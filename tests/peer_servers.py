"""Stand-ins for peers that misbehave, on real sockets: ``serving(path, handlers)`` runs
each handler on a port of its own on 127.0.0.1 and yields their API addresses; what a
handler answers (late, garbage, a lie) is the test's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web

__all__ = ["serving"]

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
