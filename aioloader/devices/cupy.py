"""NVIDIA GPUs through CuPy: the same ring and stream, CuPy arrays out."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from ..errors import ConfigError, FormatError
from ..plan import Span
from ..safetensors import TensorInfo
from .staged import CopyEngine

__all__ = ["CupyEngine", "numpy_dtype"]

_NUMPY = {
    "F64": "float64", "F32": "float32", "F16": "float16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool", "C64": "complex64",
}  # fmt: skip
_POLL_FIRST = 0.0002
_POLL_MAX = 0.002


def numpy_dtype(info: TensorInfo, framework: str) -> Any:
    """The NumPy (and CuPy) dtype of a tensor, or a clear error for BF16 and F8."""
    name = _NUMPY.get(info.dtype)
    if name is None:
        raise FormatError(
            f"tensor {info.name!r} is {info.dtype}, which {framework} arrays cannot hold; "
            "load it with framework='torch' or select other tensors"
        )
    return np.dtype(name)


class CupyEngine(CopyEngine):
    """Asynchronous host-to-device copies with CuPy on one CUDA stream.

    Args:
        device: the CUDA device index.
    """

    def __init__(self, device: int = 0) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise ConfigError("framework='cupy' needs CuPy: pip install 'aioloader[gpu]'") from exc
        if cupy.cuda.runtime.getDeviceCount() <= device:
            raise ConfigError(f"CUDA device {device} does not exist for CuPy")
        self._cupy = cupy
        self._index = device
        self.name = f"cuda:{device}"
        self._stream: Any = None

    def start(self) -> None:
        # Creates the CUDA context (a second or more in a new process): in a worker thread.
        with self._cupy.cuda.Device(self._index):
            self._stream = self._cupy.cuda.Stream(non_blocking=True)

    def pinned(self, nbytes: int) -> tuple[Any, memoryview]:
        memory = self._cupy.cuda.alloc_pinned_memory(nbytes)
        array = np.frombuffer(memory, dtype=np.uint8, count=nbytes)
        return array, memoryview(array)  # type: ignore[arg-type]

    def destination(self, span: Span) -> tuple[Any, dict[str, Any]]:
        cupy = self._cupy
        with cupy.cuda.Device(self._index):
            buffer = cupy.empty(span.nbytes, dtype=cupy.uint8)
        arrays = {}
        for info in span.tensors:
            offset = info.start - span.start
            flat = buffer[offset : offset + info.nbytes]
            arrays[info.name] = flat.view(numpy_dtype(info, "CuPy")).reshape(info.shape)
        return buffer, arrays

    def empty(self, info: TensorInfo) -> Any:
        with self._cupy.cuda.Device(self._index):
            return self._cupy.empty(info.shape, dtype=numpy_dtype(info, "CuPy"))

    def submit(self, source: Any, offset: int, target: Any, target_offset: int, nbytes: int) -> Any:
        cupy = self._cupy
        with cupy.cuda.Device(self._index):
            target[target_offset : target_offset + nbytes].set(
                source[offset : offset + nbytes], stream=self._stream
            )
            event = cupy.cuda.Event(block=False, disable_timing=True)
            event.record(self._stream)
        return event

    async def wait(self, token: Any) -> None:
        delay = _POLL_FIRST
        while not token.done:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
