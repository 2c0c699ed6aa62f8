"""How long the event loop's own callbacks held its thread, in that thread's CPU time.

A probe that sleeps 1 ms and measures how late it wakes counts the machine's scheduling
too: beside two busy processes on two CPUs, the loop's thread waits its turn for tens of
milliseconds with nothing of ours running (286 ms measured once against a 200 ms bound).
Here every callback the loop runs (``Handle._run``: task steps, ``call_soon``, timers) is
timed with ``time.thread_time``, which advances only while the thread computes: a
callback that parses a header or makes 300,000 tensors on the loop costs the same CPU
time on a busy machine as on an idle one, and time spent waiting to be scheduled, or
waiting for the GIL while another thread holds it, costs none. What it does not see is a
callback that waits without computing (a sleep); the CPU-bound work this watches for is
what held the loop before (parsing, planning, making tensors).

The interpreter's cyclic garbage collections are counted apart (``worst_collection``):
one runs in whichever callback happens to allocate, its length set by how many objects
the whole process holds (the README tells servers to collect and ``gc.freeze()`` at
start-up), and walking a million objects slows to twice its CPU time when other
processes thrash the caches (95 ms quiet, 191 ms beside two busy loops).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

__all__ = ["LoopClock", "loop_clock"]


class LoopClock:
    """The callbacks run on one thread's loop while installed: how many, and the longest
    (seconds of CPU time, collections left out); the longest collection on that thread."""

    def __init__(self) -> None:
        self.callbacks = 0
        self.reads = 0  # callbacks that read a socket ready to be read (a transport's)
        self.spent = 0.0  # all callbacks together
        self.worst = 0.0
        self.worst_callback = ""
        self.worst_collection = 0.0
        self._thread = threading.get_ident()
        self._collected = 0.0  # CPU time of the collections on the loop's thread so far
        self._collecting = 0.0

    def timed(self, run: Any) -> Any:
        clock = self

        def _run(handle: asyncio.Handle) -> None:
            if threading.get_ident() != clock._thread:  # a test server's own loop
                run(handle)
                return
            start, collected = time.thread_time(), clock._collected
            try:
                run(handle)
            finally:
                spent = time.thread_time() - start - (clock._collected - collected)
                clock.callbacks += 1
                clock.reads += "_read_ready" in getattr(handle._callback, "__qualname__", "")
                clock.spent += spent
                if spent > clock.worst:
                    clock.worst = spent
                    clock.worst_callback = repr(handle)

        return _run

    def on_collection(self, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` entry: time the collections run on the loop's thread."""
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._collecting = time.thread_time()
            return
        spent = time.thread_time() - self._collecting
        self._collected += spent
        self.worst_collection = max(self.worst_collection, spent)

    def describe(self) -> str:
        return (
            f"the longest of {self.callbacks} callbacks held the loop for "
            f"{self.worst * 1000:.1f} ms of CPU time besides collections "
            f"(the longest collection: {self.worst_collection * 1000:.1f} ms): "
            f"{self.worst_callback}"
        )


@contextmanager
def loop_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopClock]:
    """Time every callback the calling thread's loop runs inside the block."""
    clock = LoopClock()
    with monkeypatch.context() as patch:
        patch.setattr(asyncio.events.Handle, "_run", clock.timed(asyncio.events.Handle._run))
        gc.callbacks.append(clock.on_collection)
        try:
            yield clock
        finally:
            gc.callbacks.remove(clock.on_collection)
