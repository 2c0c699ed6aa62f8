"""Huge or small pages for the fresh memory a remote read faults in (prefault.py).

NumPy asks for transparent huge pages on large arrays, and tensor memory is such
an array: one fault and one 2 MiB clear rather than 512 faults, the cheap way on a
machine whose free memory is backed. On a VM whose host takes free memory back (a
virtio balloon reporting free pages), a fresh huge page waits for the host to back
all 2 MiB again: 512 MiB took 0.9-1.5 s to fill there, against 0.2-0.6 s in small
pages, while on the same VM, with memory freed moments before and still backed, small
pages cost 2-3x (docs/benchmarks.md). No file says which state the memory is in, and
a probe of a few pages does not show it: the first huge pages come from blocks not yet
handed back.

So the choice is made from the faults themselves: ``populate`` times each step it
faults in (the CPU time of its thread, which counts the host's stall and not a wait
for a busy CPU), and ``PageChoice`` keeps the rate of the huge-page steps over a window.
When they fill slower than ``SLOW`` seconds a huge page, the rest of that buffer and
the buffers after it are marked ``MADV_NOHUGEPAGE`` before they are touched; after
``RETRY`` bytes in small pages, huge pages are tried again, since the host may be
backing free memory by then.
"""

from __future__ import annotations

import threading

from ..redact import redacting_logger

__all__ = ["HUGE", "PAGES", "RETRY", "SLOW", "WINDOW", "PageChoice"]

HUGE = 2 << 20
# A huge page that takes this long to fault in was backed again by the host (measured:
# 3.5-6 ms there, 0.05-0.4 ms where the memory was backed, and 1-2.3 ms for the same
# 2 MiB in small pages with the host backing them again).
SLOW = 2.5e-3
# Huge-page steps are judged over this many bytes, not one at a time.
WINDOW = 8 << 20
RETRY = 256 << 20

logger = redacting_logger(__name__)


class PageChoice:
    """Whether the fresh memory faulted in next should be huge pages (see the module).

    Safe from any thread: the steps of several buffers are counted together.
    """

    def __init__(self, slow: float = SLOW, window: int = WINDOW, retry: int = RETRY) -> None:
        self.slow = slow
        self.window = window
        self.retry = retry
        self._lock = threading.Lock()
        self._small = False
        self._huge_bytes = 0
        self._huge_seconds = 0.0
        self._small_bytes = 0
        self._counted = 0

    def __repr__(self) -> str:
        return f"<PageChoice {'small' if self._small else 'huge'}>"

    @property
    def counted(self) -> int:
        """Bytes faulted in through ``record`` so far."""
        return self._counted

    @property
    def small(self) -> bool:
        """Whether fresh memory goes into small pages now."""
        return self._small

    def start(self) -> bool:
        """Whether a buffer about to be faulted in may use huge pages (True also when
        it is time to try them again)."""
        with self._lock:
            if self._small and self._small_bytes >= self.retry:
                self._small = False
                self._huge_bytes, self._huge_seconds = 0, 0.0
            return not self._small

    def record(self, nbytes: int, seconds: float, huge: bool) -> bool:
        """Count a step of ``nbytes`` faulted in ``seconds``, in huge pages when ``huge``;
        whether fresh memory should go into small pages from now on."""
        with self._lock:
            self._counted += nbytes
            if not huge or self._small:
                self._small_bytes += nbytes
                return self._small
            self._huge_bytes += nbytes
            self._huge_seconds += seconds
            if self._huge_bytes >= self.window:
                if self._huge_seconds > self._huge_bytes / HUGE * self.slow:
                    self._small, self._small_bytes = True, 0
                    logger.debug(
                        "fresh huge pages came at %.2f GB/s: small pages for the next %d MiB",
                        self._huge_bytes / max(self._huge_seconds, 1e-9) / 1e9,
                        self.retry >> 20,
                    )
                self._huge_bytes, self._huge_seconds = 0, 0.0
            return self._small


PAGES = PageChoice()  # the process's, shared by every load
