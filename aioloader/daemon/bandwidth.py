"""The daemon's bandwidth cap (``--max-bandwidth``): one token bucket for all its downloads.

A preload must not starve the serving traffic that shares the node's network
card, so every download of one daemon draws from one bucket that refills at the
cap and holds a quarter of a second of it. A download takes its bytes from the
bucket *before* each request that brings bytes over the network is sent, the probe
that opens a file (its first 256 KiB), listings, metadata and the bytes a retry
reads again included (see ``aioloader/runtime/pace.py``), and
range reads are cut to at most that quarter second (``quantum``), so nothing goes
out beyond the bucket's quarter second at the start. Taking before the read, rather
than as bytes arrive, is what keeps the cap on the wire: a reader that slows
down its consumption does not slow the sender until the kernel's receive
buffers are full, and a transfer held back mid-body would trip the transport's
own stall and ``min_speed`` checks. Over any span of seconds the bytes asked for
stay within ``cap x span + quantum``.

When bytes are short, the waiting reads are served by their download's priority
(priority.py), strictly: a lower one waits while a higher one wants bytes, but
never longer than ``max_wait`` (30 s): a download holds its cache entries' locks,
and a process waiting on one of them gives up when the holder shows no progress
for two minutes (cache/locks.py).
``TokenBucket`` is the arithmetic (pure, never awaits); ``Bandwidth`` the async
shell, which sleeps on one timer of the event loop and never blocks it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..errors import ConfigError
from ..settings.values import KiB, check_number
from .priority import Priority, Waiters

__all__ = [
    "DEFAULT_MAX_WAIT",
    "MAX_BANDWIDTH",
    "MIN_BANDWIDTH",
    "Bandwidth",
    "BandwidthStatistics",
    "PacedFetch",
    "TokenBucket",
    "check_bandwidth",
]

MIN_BANDWIDTH = 64 * KiB
"""A lower cap (bytes per second) is a typo, such as a missing unit."""
MAX_BANDWIDTH = 1 << 40
"""1 TiB/s: more than any network card; a higher cap is a typo."""
# The bucket holds this many seconds of the cap: the largest burst, and the largest read.
_BURST_SECONDS = 0.25
DEFAULT_MAX_WAIT = 30.0
"""The longest a read waits behind higher priorities (well under locks.STALL_SECONDS)."""
# A timer never fires sooner than this, so rounding cannot make it spin.
_MIN_SLEEP = 0.001


def check_bandwidth(value: object, what: str = "max bandwidth") -> int:
    """``value`` (bytes per second) as a cap: 0 for none, else within the bounds above.

    Raises:
        ConfigError: naming ``what`` and the value.
    """
    check_number(what, value, integer=True)
    assert isinstance(value, int)
    if value and not MIN_BANDWIDTH <= value <= MAX_BANDWIDTH:
        raise ConfigError(
            f"{what} must be 0 (no cap) or between 64KiB/s and 1TiB/s, got {value} bytes "
            "per second; write it with a unit, e.g. 500MB/s or 2GiB/s"
        )
    return value


@dataclass
class TokenBucket:
    """Bytes that may be requested now; refills at ``rate`` up to ``burst``.

    A take larger than ``burst`` is let through once the bucket is full and leaves
    it in debt, so the average holds for any size of read.
    """

    rate: float
    burst: float
    level: float
    stamp: float

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, nbytes: int, now: float) -> bool:
        """Take ``nbytes`` if the bucket has them (or is full); False otherwise."""
        self.refill(now)
        if self.level < min(nbytes, self.burst):
            return False
        self.level -= nbytes
        return True

    def delay(self, nbytes: int, now: float) -> float:
        """Seconds until ``take(nbytes)`` succeeds, if nobody else takes meanwhile."""
        self.refill(now)
        return max(0.0, (min(nbytes, self.burst) - self.level) / self.rate)

    def give_back(self, nbytes: int) -> None:
        """Return bytes taken for a read that was never issued."""
        self.level = min(self.burst, self.level + nbytes)


@dataclass(frozen=True)
class BandwidthStatistics:
    """A snapshot of a Bandwidth.

    Attributes:
        rate: the cap in bytes per second.
        throttled_bytes: bytes whose read had to wait for the cap.
        waited_seconds: time reads spent waiting for the cap, summed over reads.
        waiting: reads waiting now.
        capped_bytes: bytes read under the cap, whether they waited or not.
    """

    rate: int
    throttled_bytes: int
    waited_seconds: float
    waiting: int
    capped_bytes: int = 0


class Bandwidth:
    """A cap in bytes per second shared by every download of a daemon.

    Args:
        rate: the cap (see ``check_bandwidth``).
        max_wait: seconds after which a waiting read goes before every priority.
    """

    def __init__(self, rate: int, *, max_wait: float = DEFAULT_MAX_WAIT) -> None:
        self.rate = check_bandwidth(rate)
        if not rate:
            raise ConfigError("a Bandwidth needs a cap above 0; pass None for no cap")
        self.quantum = max(MIN_BANDWIDTH, int(rate * _BURST_SECONDS))
        """The largest read to issue at once: a quarter second of the cap."""
        self._clock = time.monotonic
        self._bucket = TokenBucket(rate, self.quantum, self.quantum, self._clock())
        self._waiters = Waiters(max_wait)
        self._timer: asyncio.TimerHandle | None = None
        self._throttled = 0
        self._waited = 0.0
        self._capped = 0

    def __repr__(self) -> str:
        return f"<Bandwidth {self.rate} B/s waiting={len(self._waiters)}>"

    def statistics(self) -> BandwidthStatistics:
        return BandwidthStatistics(
            self.rate, self._throttled, self._waited, len(self._waiters), self._capped
        )

    def paced(self, priority: Priority) -> PacedFetch:
        """What one download's requests take their bytes through (``runtime.pace.PACE``)."""
        return PacedFetch(self, priority)

    async def take(self, nbytes: int, priority: Priority = lambda: 0) -> None:
        """Wait until ``nbytes`` may be requested; higher priorities are served first."""
        if not self._waiters.first() and self._bucket.take(nbytes, self._clock()):
            self._capped += nbytes
            return
        started = self._clock()
        waiter = self._waiters.add(priority, nbytes)
        self._serve()
        try:
            await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self._bucket.give_back(nbytes)  # granted, but the read will not be issued
            else:
                self._waiters.discard(waiter)
            self._serve()
            raise
        self._throttled += nbytes
        self._capped += nbytes
        self._waited += self._clock() - started

    def _serve(self) -> None:
        """Grant what the bucket holds, best waiter first; sleep until the next can go."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while (waiter := self._waiters.first()) is not None:
            now = self._clock()
            if not self._bucket.take(waiter.amount, now):
                delay = max(_MIN_SLEEP, self._bucket.delay(waiter.amount, now))
                self._timer = asyncio.get_running_loop().call_later(delay, self._serve)
                return
            self._waiters.grant(waiter)


class PacedFetch:
    """One download's view of the cap: its reads wait at its model's priority."""

    def __init__(self, bandwidth: Bandwidth, priority: Priority) -> None:
        self._bandwidth = bandwidth
        self._priority = priority
        self.quantum = bandwidth.quantum

    async def take(self, nbytes: int) -> None:
        await self._bandwidth.take(nbytes, self._priority)
