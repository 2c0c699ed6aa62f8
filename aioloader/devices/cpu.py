"""Host memory: readers write straight into each tensor's final buffer.

Tensor memory comes from NumPy rather than ``torch.empty``: NumPy asks the
kernel for transparent huge pages on large arrays, and on the machines we
measured a read into fresh NumPy memory ran several times faster than into
``torch.empty`` memory of the same size (fewer page faults; see
docs/benchmarks.md). The tensor is then a zero-copy torch view of that array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..plan import Read
from ..safetensors import TensorInfo
from .base import Allocation, Device

__all__ = ["CpuDevice", "torch_dtype"]

_TORCH_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}  # fmt: skip


def torch_dtype(dtype: str, *, tensor: str = "") -> Any:
    """The torch dtype for a safetensors dtype string.

    Raises:
        FormatError: this torch build has no such dtype.
    """
    import torch

    from ..errors import FormatError

    found = getattr(torch, _TORCH_NAMES.get(dtype, ""), None)
    if found is None:
        raise FormatError(
            f"tensor {tensor!r}: dtype {dtype} has no equivalent in torch {torch.__version__}; "
            "upgrade torch or select other tensors"
        )
    return found


class HostAllocation(Allocation):
    """A tensor's final memory, with a writable byte view for the readers."""

    __slots__ = ("info", "tensor", "view")

    def __init__(self, info: TensorInfo) -> None:
        import torch

        self.info = info
        dtype = torch_dtype(info.dtype, tensor=info.name)
        if info.nbytes == 0:
            self.tensor = torch.empty(info.shape, dtype=dtype)
            self.view = memoryview(b"")
            return
        array = np.empty(info.nbytes, dtype=np.uint8)
        # Build the tensor now, before reads start: torch calls made while the
        # readers keep both CPUs busy were measured stalling the event loop.
        self.tensor = torch.from_numpy(array).view(dtype).reshape(info.shape)
        self.view = memoryview(array)  # type: ignore[arg-type]

    def result(self) -> Any:
        return self.tensor


class CpuDevice(Device):
    """Tensors in host memory, filled in place with no intermediate copy."""

    name = "cpu"

    def __init__(self) -> None:
        # Import torch now, not inside the first load's timing (it takes seconds).
        import torch  # noqa: F401

    def __repr__(self) -> str:
        return "<CpuDevice>"

    def allocate(self, info: TensorInfo) -> HostAllocation:
        return HostAllocation(info)

    def staging(self, read: Read, allocations: Sequence[Allocation]) -> list[memoryview]:
        buffers = []
        for piece, allocation in zip(read.pieces, allocations, strict=True):
            assert isinstance(allocation, HostAllocation)
            base = piece.tensor.start
            buffers.append(allocation.view[piece.start - base : piece.end - base])
        return buffers

    async def commit(
        self, read: Read, allocations: Sequence[Allocation], buffers: Sequence[memoryview]
    ) -> None:
        return None
