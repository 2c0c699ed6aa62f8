"""Copies of bytes that arrived ahead of a digest, bounded for the whole process.

A VerifyingBlob (verifying.py) copies a range that lands past a gap, since the
caller's buffer may be reused before the hash gets there. ``HeldCopies`` bounds
the bytes those copies hold at once, over every file the process checks, and
hands their buffers round again while any file is being checked: fresh memory
costs a page fault per 4 KiB, which made the copies cost as much as the hashing.
The buffers are freed once no file is being checked.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["HeldCopies"]


class HeldCopies:
    """Buffers for copies, ``limit`` bytes of them in use at most (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._users = 0
        self.bytes = 0  # in use now

    def __repr__(self) -> str:
        return f"<HeldCopies in use={self.bytes} free={len(self._free)} users={self._users}>"

    def take(self, nbytes: int, limit: int) -> np.ndarray | None:
        """A buffer of at least ``nbytes`` bytes, counted against ``limit``; None when
        that many are not to be had."""
        with self._lock:
            if self.bytes + nbytes > limit:
                return None
            self.bytes += nbytes
            fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, buffer: np.ndarray, nbytes: int) -> None:
        """Return a buffer ``take`` gave for ``nbytes``, its bytes no longer needed."""
        with self._lock:
            self.bytes -= nbytes
            if self._users:
                self._free.append(buffer)

    def enter(self) -> None:
        """A file is being checked: keep returned buffers for the next copies."""
        with self._lock:
            self._users += 1

    def leave(self) -> None:
        """A file is no longer being checked; the last one frees the kept buffers."""
        with self._lock:
            self._users -= 1
            if not self._users:
                self._free.clear()
