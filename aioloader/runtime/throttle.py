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

Every limiter of one origin (``scheme://host:port``) in the process shares an
``Origin``: a throttling answer to one of them pauses and halves them all, and the
swarm tells the other nodes of it (``Origin.throttled`` counts the answers this
process got, which its manifests publish) and hands on what they tell it
(``Origin.told``: a pause and a halving, never counted as this process's own, so a
signal does not echo between nodes).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["AdaptiveLimiter", "LimiterStatistics", "Origin", "origin", "origin_name", "origins"]

MAX_TOLD_PAUSE = 60.0
"""Seconds at most that one signal from another node pauses this one's requests."""


class Origin:
    """What the requests to one origin in this process share.

    Attributes:
        name: ``scheme://host:port``.
        resume_at: ``time.monotonic()`` before which no request is sent.
        signals: throttling answers so far, this process's and those told by peers:
            a limiter halves once for each one it has not seen.
        throttled: the answers this process got itself (what the swarm publishes).
        pause: the pause the last of them asked for, in seconds.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.resume_at = 0.0
        self.signals = 0
        self.throttled = 0
        self.pause = 0.0
        self.last = 0.0  # time.monotonic() of the last answer here

    def __repr__(self) -> str:
        return f"<Origin {self.name} throttled={self.throttled} signals={self.signals}>"

    def throttle(self, pause: float) -> None:
        """This process got a throttling answer asking for ``pause`` seconds."""
        self.throttled += 1
        self.pause = pause
        self.last = time.monotonic()
        self._signal(pause)

    def told(self, pause: float) -> None:
        """Another node got one: pause (``MAX_TOLD_PAUSE`` at most) and halve."""
        self._signal(min(max(pause, 0.0), MAX_TOLD_PAUSE))

    def resume_in(self) -> float:
        """Seconds left of the pause (0: none)."""
        return max(0.0, self.resume_at - time.monotonic())

    def _signal(self, pause: float) -> None:
        self.signals += 1
        self.resume_at = max(self.resume_at, time.monotonic() + pause)


_ORIGINS: dict[str, Origin] = {}


def origin_name(url: str) -> str:
    """``scheme://host:port`` of ``url`` (lower case, no user info); the URL itself
    where it has no host."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return url
    if not host:
        return url
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port else "")


def origin(name: str) -> Origin:
    """The process's ``Origin`` named ``name`` (``origin_name``), made on first use."""
    found = _ORIGINS.get(name)
    if found is None:
        found = _ORIGINS[name] = Origin(name)
    return found


def origins() -> list[Origin]:
    """Every origin this process has sent requests to or been told of."""
    return list(_ORIGINS.values())


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
        shared: the origin whose throttling answers every limiter of it heeds
            (``bind`` sets it later).
    """

    def __init__(self, maximum: int, shared: Origin | None = None) -> None:
        self._shared = shared
        self._seen = shared.signals if shared is not None else 0
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

    def bind(self, shared: Origin) -> None:
        """Share ``shared``'s signals from now on (once: a limiter serves one origin)."""
        if self._shared is None:
            self._shared = shared
            self._seen = shared.signals

    def _heed(self) -> float:
        """Take in the signals of the shared origin not seen yet (a halving each burst)
        and return when requests may go again."""
        shared = self._shared
        if shared is None:
            return self._resume_at
        if shared.signals != self._seen:
            self._seen = shared.signals
            self._limit = max(1, self._limit // 2)
            self._epoch += 1
            self._successes = 0
        return max(self._resume_at, shared.resume_at)

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
            delay = self._heed() - time.monotonic()
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
        if self._shared is not None:
            self._shared.throttle(retry_after)
            self._seen = self._shared.signals  # halved above already
        return floor

    def _wake(self) -> None:
        while self._waiters and self._in_flight < self._limit:
            future = self._waiters.popleft()
            if future.done():
                continue
            self._in_flight += 1
            future.set_result(None)
