"""Requests in flight to one server, adapted to how it copes (AIMD).

A server that answers ``429`` / ``503 Slow Down`` is asked less: the limit of
requests in flight halves (multiplicative decrease) and everyone waits out its
``Retry-After``. Requests already in flight when the limit halved were sent at
the old rate, so their throttling answers do not halve it again; one sent after
that, under the new limit, does. Every run of successful requests as long as
the current limit raises it by one (additive increase), back up to the
configured maximum. Ten pods starting at once thus settle on what the store
can serve instead of failing on throttling. The bookkeeping is synchronous,
like ByteBudget's.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

__all__ = ["AdaptiveLimiter", "LimiterStatistics"]


@dataclass(frozen=True)
class LimiterStatistics:
    """A snapshot of an AdaptiveLimiter."""

    limit: int
    maximum: int
    in_flight: int
    waiting: int
    throttled: int


class AdaptiveLimiter:
    """A semaphore whose size follows the server's throttling signals.

    Args:
        maximum: the most requests in flight (the ``concurrency`` setting).
    """

    def __init__(self, maximum: int) -> None:
        self._maximum = maximum
        self._limit = maximum
        self._in_flight = 0
        self._successes = 0
        self._throttled = 0
        # Bumped by every decrease: tells answers to requests sent before it from later ones.
        self._epoch = 0
        self._resume_at = 0.0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return f"<AdaptiveLimiter limit={self._limit}/{self._maximum} in_flight={self._in_flight}>"

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(
            self._limit, self._maximum, self._in_flight, len(self._waiters), self._throttled
        )

    async def acquire(self) -> int:
        """Wait for a slot (and for any Retry-After pause to end).

        Returns:
            A ticket to hand to ``on_throttle`` if this request gets throttled.
        """
        while True:
            delay = self._resume_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            if not self._waiters and self._in_flight < self._limit:
                self._in_flight += 1
                return self._epoch
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(future)
            try:
                await future
            except BaseException:
                if future.done() and not future.cancelled():
                    self.release()
                elif future in self._waiters:
                    self._waiters.remove(future)
                raise
            return self._epoch

    def release(self) -> None:
        """Give a slot back."""
        self._in_flight -= 1
        self._wake()

    def on_success(self) -> None:
        """A request went through: after ``limit`` of them, allow one more in flight."""
        self._successes += 1
        if self._limit < self._maximum and self._successes >= self._limit:
            self._limit += 1
            self._successes = 0
            self._wake()

    def on_throttle(self, retry_after: float, ticket: int) -> bool:
        """The server pushed back: halve the limit (once per burst) and pause.

        Args:
            retry_after: seconds every request waits before the next one is sent.
            ticket: what ``acquire`` returned for the throttled request.

        Returns:
            Whether the limit was already one request: the server refuses even that,
            so the answer is a failed attempt. Above one it only tells the limiter
            to ask less, and the additive increase provokes such answers by design.
        """
        floor = self._limit == 1
        self._throttled += 1
        self._resume_at = max(self._resume_at, time.monotonic() + retry_after)
        # Many requests in flight get the same answer at once; count it once. A
        # time window would not do: with short backoffs, requests retried within
        # it would find the limit still too high and run out of attempts.
        if ticket == self._epoch:
            self._limit = max(1, self._limit // 2)
            self._epoch += 1
        self._successes = 0
        return floor

    def _wake(self) -> None:
        while self._waiters and self._in_flight < self._limit:
            future = self._waiters.popleft()
            if future.done():
                continue
            self._in_flight += 1
            future.set_result(None)
