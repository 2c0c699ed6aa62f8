"""Devices with a separate staging area: a ring of page-locked host buffers.

Readers fill ring slots; the pipeline then submits each slot to a copy engine
(an asynchronous host-to-device copy on a dedicated CUDA stream, for a GPU) and,
once the engine reports the copy complete, the slot returns to the ring and its
budget to the readers. So a load takes about as long as the slower of reading
and copying, and host memory never exceeds ``memory_limit``. Each tensor's
device memory is allocated once per span and filled chunk by chunk, so a tensor
larger than the whole ring still loads, streamed through it.

The engine is the only part that knows about a GPU. ``HostCopyEngine`` runs the
identical path into host memory (its "stream" is one copy thread), which is how
the ring, its bound and its recycling are tested on machines without a GPU.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np

from ..errors import FormatError
from ..format.dtypes import DTYPE_SIZES
from ..format.safetensors import TensorInfo
from ..reads.plan import ALIGNMENT, Read, Span
from ..reads.room import is_out_of_memory, out_of_memory
from ..runtime.threads import Lane, finish_before_cancel, run_in
from ..settings.values import Limits
from .base import Device, SpanAllocation

__all__ = ["CopyEngine", "HostCopyEngine", "RingStatistics", "StagedDevice"]

# One slot being read into and one waiting for the copy engine, per reader.
RING_SLOTS_PER_READER = 2


class CopyEngine(ABC):
    """Moves bytes from page-locked host memory to a device, asynchronously."""

    name: str

    def start(self) -> None:  # noqa: B027 - optional hook
        """Set up what takes long (imports, the CUDA context, streams); called once, in a
        worker thread, before anything else, so the event loop never waits for it."""

    @abstractmethod
    def pinned(self, nbytes: int) -> tuple[Any, memoryview]:
        """Page-locked host memory (4 KiB-aligned): an owner handle and a writable view."""

    @abstractmethod
    def destination(self, span: Span) -> tuple[Any, dict[str, Any]]:
        """Device memory for a span, and its tensors (views into it) by name."""

    @abstractmethod
    def empty(self, info: TensorInfo) -> Any:
        """A tensor with no elements on the device."""

    @abstractmethod
    def submit(self, source: Any, offset: int, target: Any, target_offset: int, nbytes: int) -> Any:
        """Start copying ``nbytes`` from ``source[offset:]`` to ``target[target_offset:]``.

        Returns a token for ``wait``; copies complete in submission order.
        """

    @abstractmethod
    async def wait(self, token: Any) -> None:
        """Return once the copy of ``token`` is complete, without blocking the loop."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release streams and threads."""


def check_alignment(info: TensorInfo, span: Span) -> None:
    """Device tensors are typed views of a byte buffer: each must start on its element size."""
    size = DTYPE_SIZES[info.dtype]
    if (info.start - span.start) % size:
        raise FormatError(
            f"{span.url}: tensor {info.name!r} starts at byte {info.start}, not a multiple of "
            f"its {size}-byte element size, so it cannot be placed on a device in place; "
            "re-save the file with the safetensors library (which aligns tensors) or load to cpu"
        )


class RingStatistics:
    """Use of the staging ring, for tests and reports."""

    def __init__(self, slots: int, slot_size: int) -> None:
        self.slots = slots
        self.slot_size = slot_size
        self.in_use = 0
        self.peak_in_use = 0
        self.slots_touched: set[int] = set()
        self.copies = 0
        self.pinned_bytes = 0

    def __repr__(self) -> str:
        return (
            f"<RingStatistics slots={self.slots} slot_size={self.slot_size} in_use={self.in_use} "
            f"peak={self.peak_in_use} touched={len(self.slots_touched)} copies={self.copies}>"
        )


class _DeviceSpan(SpanAllocation):
    __slots__ = ("_tensors", "buffer", "span")

    def __init__(self, span: Span, buffer: Any, tensors: dict[str, Any]) -> None:
        self.span = span
        self.buffer = buffer
        self._tensors = tensors

    def tensor(self, info: TensorInfo) -> Any:
        return self._tensors[info.name]


class StagedDevice(Device):
    """A destination filled through a ring of pinned staging slots.

    The ring is page-locked on first need (a load whose tensors are all empty
    pins nothing), and a reader waits for a free slot once every slot is being
    read into or copied from.

    Args:
        engine: the copy engine (CUDA via torch or CuPy, or host memory for tests).
        limits: ``chunk_size`` sizes the slots; the ring holds two slots per
            reader (``concurrency``), within ``memory_limit``: one being read, one
            queued for the copy engine. Page-locking is slow (slower than the reads
            it serves), so the ring is no larger than keeping both busy needs.
        setup: the lane (threads.py) where the engine starts and the ring is pinned.
    """

    copies = True

    def __init__(self, engine: CopyEngine, limits: Limits, setup: Executor) -> None:
        self._engine = engine
        self._setup = setup
        self._slot_size = max(ALIGNMENT, limits.read_size - limits.read_size % ALIGNMENT)
        per_reader = RING_SLOTS_PER_READER * limits.concurrency
        self._slots = max(2, min(limits.staging_bytes // self._slot_size, per_reader))
        self._ring: Any = None
        self._views: list[memoryview] = []
        self._free: list[int] = []
        self._free_slots = asyncio.Semaphore(self._slots)
        self._slot_of: dict[int, int] = {}
        self._started = False
        self._lock = asyncio.Lock()
        self.ring = RingStatistics(self._slots, self._slot_size)

    def __repr__(self) -> str:
        return f"<StagedDevice {self.name} {self.ring!r}>"

    @property
    def name(self) -> str:  # type: ignore[override]
        """The engine's device, e.g. ``cuda:0`` once ``cuda`` is resolved."""
        return self._engine.name

    def cost(self, read: Read) -> int:
        return self._slot_size

    @property
    def ring_bytes(self) -> int:
        return self._slots * self._slot_size

    async def prepare(self) -> None:
        if self._started:
            return
        async with self._lock:
            if not self._started:
                # Creating a CUDA context takes a while: not on the event loop.
                await run_in(self._setup, self._engine.start)
                self._started = True

    async def _pin_ring(self) -> None:
        async with self._lock:
            if self._ring is None:
                # Page-locking hundreds of MiB takes a while: not on the event loop.
                owner, view = await run_in(self._setup, self._engine.pinned, self.ring_bytes)
                self._views = [
                    view[i * self._slot_size : (i + 1) * self._slot_size]
                    for i in range(self._slots)
                ]
                self._free = list(range(self._slots - 1, -1, -1))
                self._ring = owner
                self.ring.pinned_bytes = self.ring_bytes

    def allocate(self, span: Span) -> SpanAllocation:
        for info in span.tensors:
            check_alignment(info, span)
        try:
            buffer, tensors = self._engine.destination(span)
        except Exception as exc:  # torch's OutOfMemoryError is a RuntimeError
            if is_out_of_memory(exc):
                raise out_of_memory(
                    span.url, span.tensors, span.nbytes, f"memory on {self.name}", exc
                ) from None
            raise
        return _DeviceSpan(span, buffer, tensors)

    def empty(self, info: TensorInfo) -> Any:
        return self._engine.empty(info)

    async def staging(self, read: Read, allocation: SpanAllocation) -> memoryview:
        if self._ring is None:
            await self._pin_ring()
        await self._free_slots.acquire()
        slot = self._free.pop()
        self._slot_of[id(read)] = slot
        stats = self.ring
        stats.in_use += 1
        stats.peak_in_use = max(stats.peak_in_use, stats.in_use)
        stats.slots_touched.add(slot)
        return self._views[slot][: read.nbytes]

    def submit(self, read: Read, allocation: SpanAllocation, buffer: memoryview) -> Any:
        assert isinstance(allocation, _DeviceSpan)
        slot = self._slot_of[id(read)]
        span = allocation.span
        # Bytes past the end of the file were never read: do not copy them.
        last = max(t.end for t in span.tensors)
        nbytes = min(read.end, last) - read.start
        self.ring.copies += 1
        return self._engine.submit(
            self._ring, slot * self._slot_size, allocation.buffer, read.start - span.start, nbytes
        )

    async def wait(self, read: Read, token: Any) -> None:
        # The copy cannot be called back: keep its slot until it has finished
        # reading from it, or the next read would overwrite bytes in flight.
        waiting = asyncio.ensure_future(self._engine.wait(token))
        try:
            await finish_before_cancel(waiting)
        finally:
            if waiting.done():
                self.release(read)

    def release(self, read: Read) -> None:
        slot = self._slot_of.pop(id(read), None)
        if slot is not None:
            self._free.append(slot)
            self._free_slots.release()
            self.ring.in_use -= 1

    async def aclose(self) -> None:
        await self._engine.aclose()
        self._ring = None
        self._views = []


class HostCopyEngine(CopyEngine):
    """Copies into host memory through the same ring: the GPU path, testable anywhere.

    Its "stream" is one thread (the ``copy`` lane, threads.py) running copies in
    submission order, so copies overlap reads exactly as on a GPU.

    Args:
        framework: ``"torch"`` tensors or ``"numpy"`` arrays out.
    """

    name = "host-staged"

    def __init__(self, framework: str = "torch") -> None:
        self._framework = framework
        self._stream = Lane("copy", 1)

    def start(self) -> None:
        if self._framework == "torch":
            import torch  # noqa: F401 - seconds on first import

    def pinned(self, nbytes: int) -> tuple[Any, memoryview]:
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        skip = -raw.ctypes.data % ALIGNMENT
        array = raw[skip : skip + nbytes]
        return array, memoryview(array)  # type: ignore[arg-type]

    def destination(self, span: Span) -> tuple[Any, dict[str, Any]]:
        from .cpu import HostSpan

        host = HostSpan(span, self._framework)
        return host.array, {t.name: host.tensor(t) for t in span.tensors}

    def empty(self, info: TensorInfo) -> Any:
        from .cpu import empty_host

        return empty_host(info, self._framework)

    def submit(self, source: Any, offset: int, target: Any, target_offset: int, nbytes: int) -> Any:
        def copy() -> None:
            target[target_offset : target_offset + nbytes] = source[offset : offset + nbytes]

        return self._stream.submit(copy)

    async def wait(self, token: Future[None]) -> None:
        await asyncio.wrap_future(token)

    async def aclose(self) -> None:
        self._stream.shutdown(wait=True)
