"""Retrying remote requests: attempts, backoff with jitter, throttling, the deadline.

A failure worth another attempt is a RetryableError. The Retrier runs an attempt
until it succeeds, counting only the attempts that brought no bytes against
``HttpOptions.max_attempts``: a link that drops every connection but delivers
something each time still finishes. ``429`` / ``503`` also lower the requests in
flight through the AdaptiveLimiter (see throttle.py), and use up an attempt only
once the limiter is down to one request in flight: above that, asking less is the
answer, not giving up.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...errors import ReadError, ReadTimeoutError
from ...redact import redacting_logger
from ...runtime.throttle import AdaptiveLimiter, LimiterStatistics, origin, origin_name
from ...settings.values import HttpOptions
from .client import Pace

__all__ = ["Retrier", "RetryableError", "backoff_delay", "keep_pace"]

logger = redacting_logger(__name__)
T = TypeVar("T")


class RetryableError(Exception):
    """A failure worth another attempt (the transfer resumes where it stopped).

    Args:
        reason: what went wrong, for the log and the final error.
        throttled: the server asked us to slow down (``429`` / ``503``).
        retry_after: seconds the server asked us to wait, if it said.
        timeout: a stall or a deadline: the final error is a ReadTimeoutError.
        slow: the transfer was dropped for being too slow, whatever arrived.
    """

    def __init__(
        self, reason: str, *, throttled: bool = False, retry_after: float | None = None,
        timeout: bool = False, slow: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(reason)
        self.throttled = throttled
        self.retry_after = retry_after
        self.timeout = timeout
        self.slow = slow


def keep_pace(pace: Pace, done: int) -> None:
    """Raise a RetryableError when ``pace`` finds ``done`` bytes too few by now."""
    slow = pace.too_slow(done)
    if slow is not None:
        raise RetryableError(slow, timeout=True, slow=True)


def backoff_delay(
    options: HttpOptions,
    wasted: int,
    moved: bool,
    retry_after: float | None,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to wait before the next attempt.

    Args:
        wasted: attempts so far that brought nothing.
        moved: the last attempt brought bytes: try again at once.
        retry_after: what the server asked for, capped at ``backoff_max``.
        uniform: the source of jitter.
    """
    ceiling = min(options.backoff_max, options.backoff * (2 ** max(0, wasted - 1)))
    delay = uniform(ceiling / 2, ceiling) if not moved else 0.0
    if retry_after is not None:
        delay = max(delay, min(retry_after, options.backoff_max))
    return delay


class Retrier:
    """Runs attempts at one server's requests, under its AdaptiveLimiter.

    Args:
        concurrency: the most requests in flight.
        options: attempts, backoff and deadline.
    """

    def __init__(self, concurrency: int, options: HttpOptions) -> None:
        self._options = options
        self._limiter = AdaptiveLimiter(concurrency)

    def __repr__(self) -> str:
        return repr(self._limiter)

    def statistics(self) -> LimiterStatistics:
        return self._limiter.statistics()

    def pace(self, done: int = 0) -> Pace:
        """A minimum-speed check for a transfer that has ``done`` bytes so far."""
        return Pace(self._options.min_speed, self._options.speed_window, done)

    async def run(
        self,
        url: str,
        start: int,
        end: int,
        attempt_once: Callable[[], Awaitable[T]],
        progress: Callable[[], int] | None = None,
    ) -> T:
        """Run ``attempt_once`` until it succeeds or attempts run out.

        Only attempts that make no progress use up ``max_attempts``: a link that
        drops every connection but delivers bytes each time (``progress`` grows)
        still finishes. An attempt that ended in a stall or was dropped for being too
        slow counts, however many bytes it brought, so a trickle cannot retry forever.

        Args:
            url, start, end: what is read, for messages.
            attempt_once: one attempt; it raises RetryableError to be retried.
            progress: the bytes received so far, across attempts.

        Raises:
            ReadError: every attempt failed (ReadTimeoutError when the last one
                stalled, or when the deadline passed).
        """
        options = self._options
        # Its origin's throttling answers, here or on a peer (the swarm), slow this too.
        self._limiter.bind(origin(origin_name(url)))
        try:
            async with asyncio.timeout(options.deadline):
                return await self._attempts(url, start, end, attempt_once, progress)
        except TimeoutError as exc:
            if isinstance(exc, ReadTimeoutError):
                raise
            raise ReadTimeoutError(
                f"{url} bytes [{start}, {end}) did not arrive within the deadline of "
                f"{options.deadline:g} s (HttpOptions.deadline); raise it, or check the "
                "server's speed",
                url=url, start=start, end=end,
            ) from None  # fmt: skip

    async def _attempts(
        self,
        url: str,
        start: int,
        end: int,
        attempt_once: Callable[[], Awaitable[T]],
        progress: Callable[[], int] | None,
    ) -> T:
        options = self._options
        limiter = self._limiter
        failures: list[str] = []
        wasted = 0  # attempts that brought nothing
        timed_out = False
        while True:
            before = progress() if progress is not None else 0
            ticket = await limiter.acquire()
            try:
                result = await attempt_once()
            except RetryableError as exc:
                failures.append(str(exc))
                timed_out = exc.timeout
                # A stall or a trickle is no progress, whatever bytes came before it.
                moved = progress is not None and progress() > before and not exc.timeout
                if exc.throttled:
                    # The pause holds back every request, so it is capped like one delay:
                    # a huge Retry-After must not stall the load beyond backoff_max.
                    pause = min(exc.retry_after or options.backoff, options.backoff_max)
                    # Throttled while the limiter can still ask less: the limiter's
                    # business, not a failed attempt. Its additive increase probes past
                    # the server's capacity by design; counted, six such answers to one
                    # range failed loads by chance.
                    moved |= not limiter.on_throttle(pause, ticket)
                retry_after = exc.retry_after
            else:
                limiter.on_success()
                return result
            finally:
                limiter.release()
            if not moved:
                wasted += 1
                if wasted == options.max_attempts:
                    break
            delay = backoff_delay(options, wasted, moved, retry_after)
            logger.info(
                "retrying %s bytes [%d, %d) in %.2f s (%d of %d attempts without progress): %s",
                url, start, end, delay, wasted, options.max_attempts, failures[-1],
            )  # fmt: skip
            await asyncio.sleep(delay)
        error = ReadTimeoutError if timed_out else ReadError
        raise error(
            f"{url} bytes [{start}, {end}) failed after {len(failures)} attempts, "
            f"{wasted} of them without progress (last: {failures[-1]}); check that the server "
            "is reachable and healthy, or raise HttpOptions.max_attempts / stall_timeout",
            url=url, start=start, end=end,
        )  # fmt: skip
