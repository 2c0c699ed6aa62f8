"""Host memory: readers write straight into each tensor's final buffer.

Span memory comes from NumPy rather than ``torch.empty``: NumPy asks the
kernel for transparent huge pages on large arrays, so a read into fresh NumPy
memory takes far fewer page faults than into ``torch.empty`` memory of the same
size (see docs/benchmarks.md). The tensor is then a zero-copy torch (or
NumPy) view of that array. The tensors of one span share its buffer, which is freed
when the last is dropped.
"""

from __future__ import annotations

import sys
from concurrent.futures import Executor
from typing import Any

import numpy as np

from ..format.dtypes import DTYPE_SIZES, import_torch, numpy_dtype, torch_dtype
from ..format.safetensors import TensorInfo
from ..reads.plan import ALIGNMENT, Read, Span
from ..reads.room import is_out_of_memory, out_of_memory
from ..runtime.container_memory import memory_limit
from ..runtime.threads import run_in
from .base import Device, SpanAllocation

__all__ = ["CpuDevice", "HostSpan"]


class HostSpan(SpanAllocation):
    """One page-aligned host buffer for a span; its tensors are views into it.

    The buffer's start is 4 KiB-aligned like the span's file offset, so reads can
    go straight into it with ``O_DIRECT``. Tensors are built now, before reads
    start: torch calls made while readers keep every CPU busy stall the event loop.
    """

    __slots__ = ("_tensors", "array", "span")

    def __init__(self, span: Span, framework: str = "torch") -> None:
        self.span = span
        raw = np.empty(span.nbytes + ALIGNMENT, dtype=np.uint8)
        skip = -raw.ctypes.data % ALIGNMENT
        self.array = raw[skip : skip + span.nbytes]
        self._tensors: dict[str, Any] = {}
        if framework == "numpy":
            for info in span.tensors:
                offset = info.start - span.start
                array = self.array[offset : offset + info.nbytes]
                dtype = numpy_dtype(info.dtype, tensor=info.name)
                self._tensors[info.name] = array.view(dtype).reshape(info.shape)
            return
        import torch

        # Each tensor over its own bytes (so that it can be saved alone), shaped before
        # it is typed: a tensor typed first and shaped after keeps a second tensor object
        # alive behind it (two objects a tensor, each one walked by every full garbage
        # collection).
        for info in span.tensors:
            offset = info.start - span.start
            flat = self.array[offset : offset + info.nbytes]
            dtype = torch_dtype(info.dtype, tensor=info.name)
            if info.shape:
                rows = (*info.shape[:-1], info.shape[-1] * DTYPE_SIZES[info.dtype])
                tensor = torch.from_numpy(flat.reshape(rows)).view(dtype)
            else:
                tensor = torch.from_numpy(flat).view(dtype).reshape(())
            self._tensors[info.name] = tensor

    def tensor(self, info: TensorInfo) -> Any:
        return self._tensors[info.name]


def empty_host(info: TensorInfo, framework: str) -> Any:
    """An empty tensor (``"torch"``) or array (``"numpy"``) in host memory for ``info``."""
    if framework == "numpy":
        return np.empty(info.shape, dtype=numpy_dtype(info.dtype, tensor=info.name))
    import torch

    return torch.empty(info.shape, dtype=torch_dtype(info.dtype, tensor=info.name))


class CpuDevice(Device):
    """Tensors in host memory, filled in place with no intermediate copy.

    Args:
        framework: ``"torch"`` for torch tensors, ``"numpy"`` for NumPy arrays.
        setup: the lane (threads.py) that the first import of torch runs in.
    """

    name = "cpu"

    def __init__(self, framework: str, setup: Executor) -> None:
        self._framework = framework
        self._setup = setup
        # What this process may use (room.py): a few small files of /proc and /sys, read
        # at most every few seconds (container_memory.FRESH_FOR), as Limits reads them.
        self.room = memory_limit()

    async def prepare(self) -> None:
        if self._framework == "torch" and "torch" not in sys.modules:
            # The first import of torch takes seconds: not on the event loop.
            await run_in(self._setup, import_torch)

    def __repr__(self) -> str:
        return f"<CpuDevice framework={self._framework}>"

    def allocate(self, span: Span) -> HostSpan:
        try:
            return HostSpan(span, self._framework)
        except Exception as exc:  # MemoryError, also from torch
            if is_out_of_memory(exc):
                raise out_of_memory(
                    span.url, span.tensors, span.nbytes, "host memory", exc
                ) from None
            raise

    def empty(self, info: TensorInfo) -> Any:
        return empty_host(info, self._framework)

    async def staging(self, read: Read, allocation: SpanAllocation) -> memoryview:
        assert isinstance(allocation, HostSpan)
        base = allocation.span.start
        return memoryview(allocation.array[read.start - base : read.end - base])  # type: ignore[arg-type]
