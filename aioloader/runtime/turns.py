"""``Turns``: a semaphore whose waiters go in the order of a key, not of arrival.

A fetch reads many ranges of many files through a few read slots. Taken in the
order the ranges were queued, the slots go round the files in whatever order their
set-up finished, and every file completes near the end; in the order of (file,
offset) the first file completes first, then the next: a cache entry commits early,
and the swarm publishes it to the other nodes while the rest still downloads.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["Turns"]


class Turns:
    """At most ``n`` holders at once; a freed turn goes to the waiter with the lowest key
    (ties: the first to ask)."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"Turns needs n >= 1, got {n}")
        self._free = n
        self._waiting: list[tuple[Any, int, asyncio.Future[None]]] = []  # a heap
        self._order = itertools.count()

    def __repr__(self) -> str:
        return f"<Turns free={self._free} waiting={len(self._waiting)}>"

    @asynccontextmanager
    async def turn(self, key: Any) -> AsyncIterator[None]:
        """Hold a turn for the ``async with`` block, waiting behind lower keys."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            given: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (key, next(self._order), given))
            try:
                await given
            except asyncio.CancelledError:
                if given.done() and not given.cancelled():
                    self._pass()  # handed a turn as it was cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._pass()

    def _pass(self) -> None:
        """Give a freed turn to the first waiter still waiting, or free it."""
        while self._waiting:
            _, _, given = heapq.heappop(self._waiting)
            if not given.done():
                given.set_result(None)
                return
        self._free += 1
