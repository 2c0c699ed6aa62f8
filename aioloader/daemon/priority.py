"""Download priorities: who goes first when the daemon's downloads or bandwidth run short.

A model's ``priority`` is an integer, higher first, 0 by default. ``Waiters`` is
the queue both scarce things share: the download slots (``PriorityGate``, at most
``--max-downloads`` models at once) and the bandwidth cap (bandwidth.py). Each
waiter is served by the priority its model has when a slot or bytes come free,
not when it began to wait, so a POST that raises a queued model's priority takes
effect at once; equal priorities go in arrival order. The priority is strict: a
lower one waits while a higher one wants what is free, unless the queue bounds the
wait (``max_wait``): a waiter past it goes next, oldest first.

The bookkeeping never awaits: a cancelled waiter either never got its share or
gives it back in the same ``except`` that saw the cancellation.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..settings.values import check_number

__all__ = ["MAX_PRIORITY", "PriorityGate", "Waiter", "Waiters", "check_priority"]

MAX_PRIORITY = 1_000_000
"""Priorities lie within +-MAX_PRIORITY: they order a handful of models, not count bytes."""

Priority = Callable[[], int]


def check_priority(value: object, what: str = "priority") -> int:
    """``value`` as a priority: an integer within +-MAX_PRIORITY (not a bool, not a float).

    Raises:
        ConfigError: naming ``what`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer (higher goes first), got {value!r:.40}")
    if abs(value) > MAX_PRIORITY:
        raise ConfigError(
            f"{what} must lie between {-MAX_PRIORITY} and {MAX_PRIORITY}, got {value}; "
            "higher goes first, 0 is the default"
        )
    return value


@dataclass(eq=False)
class Waiter:
    """One task waiting for ``amount`` of something."""

    priority: Priority
    amount: int
    order: int
    since: float  # the event loop's time when it began to wait
    future: asyncio.Future[None] = field(repr=False)


class Waiters:
    """Futures waiting for a share, served highest priority first, then first come.

    Args:
        max_wait: seconds after which a waiter goes before every priority (None: never).
    """

    def __init__(self, max_wait: float | None = None) -> None:
        self._items: list[Waiter] = []
        self._order = itertools.count()
        self._max_wait = max_wait

    def __len__(self) -> int:
        return len(self._items)

    def add(self, priority: Priority, amount: int = 1) -> Waiter:
        loop = asyncio.get_running_loop()
        waiter = Waiter(priority, amount, next(self._order), loop.time(), loop.create_future())
        self._items.append(waiter)
        return waiter

    def first(self) -> Waiter | None:
        """The waiter to serve next (priorities are read now), or None."""
        # A handful of waiters at most (downloads x reads in flight): a scan is enough,
        # and it sees priorities changed while they waited.
        self._items = [w for w in self._items if not w.future.done()]
        if not self._items:
            return None
        if self._max_wait is not None:
            oldest = self._items[0]  # added in order, and removal keeps it
            if asyncio.get_running_loop().time() - oldest.since > self._max_wait:
                return oldest
        return max(self._items, key=lambda w: (w.priority(), -w.order))

    def grant(self, waiter: Waiter) -> None:
        """Hand ``waiter`` its share: it leaves the queue and its task wakes."""
        self._items.remove(waiter)
        waiter.future.set_result(None)

    def discard(self, waiter: Waiter) -> None:
        if waiter in self._items:
            self._items.remove(waiter)


class PriorityGate:
    """At most ``limit`` holders at once; the rest wait, highest priority first.

    Args:
        limit: how many may hold the gate at once (``--max-downloads``).
    """

    def __init__(self, limit: int) -> None:
        check_number("max downloads", limit, integer=True, positive=True)
        self._limit = limit
        self._held = 0
        self._waiters = Waiters()

    def __repr__(self) -> str:
        return f"<PriorityGate held={self._held}/{self._limit} waiting={len(self._waiters)}>"

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def slot(self, priority: Priority) -> AsyncIterator[None]:
        """Hold one place for the body of the ``async with``."""
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: Priority) -> None:
        if self._held < self._limit and not self._waiters.first():
            self._held += 1
            return
        waiter = self._waiters.add(priority)
        try:
            await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release()  # granted, but cancelled before it could run
            else:
                self._waiters.discard(waiter)
            raise

    def _release(self) -> None:
        self._held -= 1
        while self._held < self._limit and (waiter := self._waiters.first()) is not None:
            self._held += 1
            self._waiters.grant(waiter)
