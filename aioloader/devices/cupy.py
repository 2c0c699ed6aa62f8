"""NVIDIA GPUs through CuPy: the same ring and stream, CuPy arrays out."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format.dtypes import numpy_dtype
from ..format.safetensors import TensorInfo
from ..reads.plan import Span
from .cuda_versions import cuda_mismatch, runtime_version
from .staged import CopyEngine

__all__ = ["CupyEngine"]

_POLL_FIRST = 0.0002
_POLL_MAX = 0.002


def _check_torch_agrees(cupy: Any) -> None:
    """Refuse CuPy built for another CUDA major than torch's, when torch is loaded
    (not imported here: a process without torch has one CUDA runtime, CuPy's)."""
    torch = sys.modules.get("torch")
    version = getattr(getattr(torch, "version", None), "cuda", None)
    if version is None:
        return
    ours = runtime_version(cupy.cuda.runtime.runtimeGetVersion())
    reason = cuda_mismatch(ours, version)
    if reason is not None:
        raise ConfigError(f"framework='cupy': {reason}")


class CupyEngine(CopyEngine):
    """Asynchronous host-to-device copies with CuPy on one CUDA stream.

    Args:
        device: the CUDA device index.
    """

    def __init__(self, device: int = 0) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise ConfigError(
                "framework='cupy' needs CuPy built for your CUDA: pip install "
                "'aioloader[gpu-cuda12]' or 'aioloader[gpu-cuda13]' (torch's CUDA, if torch "
                "is in the process: torch.version.cuda)"
            ) from exc
        _check_torch_agrees(cupy)
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
            dtype = numpy_dtype(info.dtype, tensor=info.name, framework="CuPy")
            arrays[info.name] = flat.view(dtype).reshape(info.shape)
        return buffer, arrays

    def empty(self, info: TensorInfo) -> Any:
        with self._cupy.cuda.Device(self._index):
            dtype = numpy_dtype(info.dtype, tensor=info.name, framework="CuPy")
            return self._cupy.empty(info.shape, dtype=dtype)

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
