"""The staging byte budget: bounded memory with backpressure.

Readers ``await acquire(n)`` before they put ``n`` bytes in flight and the
consumer calls ``release(n)`` once those bytes have reached their destination.
When the budget is spent, readers wait in arrival order. All bookkeeping is
synchronous, so a cancelled waiter can never leave it half updated: a grant is
handed over inside ``release`` itself, and a waiter cancelled after its grant
gives it straight back.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

__all__ = ["BudgetStatistics", "ByteBudget", "Share"]


@dataclass(frozen=True)
class BudgetStatistics:
    """A snapshot of a budget."""

    limit: int
    used: int
    peak: int
    waiting: int


class ByteBudget:
    """A FIFO byte semaphore.

    Args:
        limit: the most bytes that may be held at once.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"budget limit must be positive, got {limit}")
        self._limit = limit
        self._used = 0
        self._peak = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def __repr__(self) -> str:
        return (
            f"<ByteBudget used={self._used} limit={self._limit} "
            f"peak={self._peak} waiting={len(self._waiters)}>"
        )

    @property
    def limit(self) -> int:
        return self._limit

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics(self._limit, self._used, self._peak, len(self._waiters))

    def _take(self, n: int) -> None:
        self._used += n
        self._peak = max(self._peak, self._used)

    def acquire_nowait(self, n: int) -> bool:
        """Take ``n`` bytes if they fit and nobody is queued ahead; never waits."""
        self._check(n)
        if not self._waiters and self._used + n <= self._limit:
            self._take(n)
            return True
        return False

    async def acquire(self, n: int) -> None:
        """Take ``n`` bytes, waiting (in arrival order) until they fit."""
        if self.acquire_nowait(n):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, future)
        self._waiters.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                # Granted in the same tick we were cancelled: hand it back.
                self.release(n)
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                # Our place at the head may have held up smaller waiters.
                self._wake()
            raise

    def release(self, n: int) -> None:
        """Return ``n`` bytes and hand them to waiters that now fit."""
        if n < 0 or n > self._used:
            raise RuntimeError(f"released {n} bytes but only {self._used} are held")
        self._used -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, future = self._waiters[0]
            if future.done():  # cancelled, removal pending in its own task
                self._waiters.popleft()
                continue
            if self._used + n > self._limit:
                return
            self._waiters.popleft()
            self._take(n)
            future.set_result(None)

    def _check(self, n: int) -> None:
        if n <= 0 or n > self._limit:
            raise ValueError(f"cannot take {n} bytes from a budget of {self._limit}")


class Share:
    """One load's part of a shared budget: what it holds now, and the most it held.

    Args:
        budget: the budget every load of a Loader draws from.
    """

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.held = 0
        self.peak = 0

    def __repr__(self) -> str:
        return f"<Share held={self.held} peak={self.peak} of {self.budget!r}>"

    async def acquire(self, n: int) -> None:
        await self.budget.acquire(n)
        self.held += n
        self.peak = max(self.peak, self.held)

    def release(self, n: int) -> None:
        self.budget.release(n)
        self.held -= n
