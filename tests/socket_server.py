"""``SocketServer``: a TCP server on 127.0.0.1 for tests that write raw HTTP bytes.

A subclass says what to do with one connection (``handle``); the base starts the
server, tracks each connection's task, and on exit cancels and awaits them all and
closes every connection, so no test leaves a handler running.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

__all__ = ["SocketServer"]


class SocketServer:
    """Use as ``async with Subclass(...) as server:``; ``server.port`` is its port."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection (the writer is closed afterwards)."""
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self.handle(reader, writer)
        finally:
            self._handlers.discard(task)
            writer.close()
