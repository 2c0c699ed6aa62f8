"""What a node counts of its swarm fetches, cheaply, for the cluster's view (view.py):
the bytes of each model, and of each of its files, read from the origin and from peers
(``Reads``), each with its rate over the last few seconds (``Meter``).

A count is an addition and a look at the clock: a meter keeps one sum per half second
of the last ``RATE_WINDOW`` seconds, and a rate is asked only when someone looks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RATE_WINDOW", "FileReads", "Meter", "Reads"]

RATE_WINDOW = 5.0  # seconds a rate is measured over
_STEP = 0.5  # seconds one kept sum covers
_SLOTS = int(RATE_WINDOW / _STEP)

Clock = Callable[[], float]


class Meter:
    """Bytes counted (``total``), and their rate over the last ``RATE_WINDOW`` seconds
    (over the time since the first count, while that is shorter)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.total = 0
        self._clock = clock
        self._first: float | None = None
        self._slots: deque[list[int]] = deque()  # [slot number, bytes in it]

    def __repr__(self) -> str:
        return f"<Meter {self.total} B, {self.rate():.0f} B/s>"

    def add(self, n: int) -> None:
        now = self._clock()
        slot = int(now // _STEP)
        if self._first is None:
            self._first = now
        if self._slots and self._slots[-1][0] == slot:
            self._slots[-1][1] += n
        else:
            self._slots.append([slot, n])
        self.total += n
        self._trim(slot)

    def rate(self) -> float:
        """Bytes per second over the last ``RATE_WINDOW`` seconds."""
        now = self._clock()
        self._trim(int(now // _STEP))
        if self._first is None:
            return 0.0
        span = min(RATE_WINDOW, max(_STEP, now - self._first))
        return sum(b for _, b in self._slots) / span

    def _trim(self, slot: int) -> None:
        while self._slots and self._slots[0][0] <= slot - _SLOTS:
            self._slots.popleft()


@dataclass
class FileReads:
    """One file's bytes from the origin and from peers."""

    origin: Meter
    peers: Meter


@dataclass
class Reads:
    """Bytes of one model read from the origin and from peers, in all and per file
    (by its manifest name)."""

    origin: int = 0
    peers: int = 0
    files: dict[str, FileReads] = field(default_factory=dict, repr=False)
    clock: Clock = field(default=time.monotonic, repr=False, compare=False)

    def of(self, name: str) -> FileReads:
        found = self.files.get(name)
        if found is None:
            found = self.files[name] = FileReads(Meter(self.clock), Meter(self.clock))
        return found

    def from_origin(self, name: str, n: int) -> None:
        self.origin += n
        self.of(name).origin.add(n)

    def from_peers(self, name: str, n: int) -> None:
        self.peers += n
        self.of(name).peers.add(n)
