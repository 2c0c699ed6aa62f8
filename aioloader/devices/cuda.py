"""NVIDIA GPUs through torch: pinned staging ring, copies on a dedicated CUDA stream."""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import ConfigError
from ..format.dtypes import torch_dtype
from ..format.safetensors import TensorInfo
from ..reads.plan import Span
from .staged import CopyEngine

__all__ = ["TorchCudaEngine"]

# Completion is polled, never waited for on the loop: first eagerly, then backing off.
_POLL_FIRST = 0.0002
_POLL_MAX = 0.002


class TorchCudaEngine(CopyEngine):
    """Asynchronous host-to-device copies with torch on one CUDA stream.

    Args:
        device: a CUDA ``torch.device`` or its name (``"cuda"``, ``"cuda:1"``).
    """

    def __init__(self, device: Any) -> None:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {str(device)!r} was asked for, but torch {torch.__version__} sees no CUDA "
                "device (torch.cuda.is_available() is False): install a CUDA build of torch, "
                "check the NVIDIA driver and that the container was given a GPU, or load to cpu"
            )
        self._device = torch.device(device)
        if self._device.index is not None and self._device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {str(device)!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
        self.name = str(self._device)
        self._stream: Any = None

    def start(self) -> None:
        import torch

        # Creates the CUDA context (a second or more in a new process): in a worker thread.
        if self._device.index is None:
            self._device = torch.device("cuda", torch.cuda.current_device())
            self.name = str(self._device)
        self._stream = torch.cuda.Stream(device=self._device)  # type: ignore[no-untyped-call]

    def pinned(self, nbytes: int) -> tuple[Any, memoryview]:
        import torch

        # cudaHostAlloc memory is page-aligned, so reads may use O_DIRECT into it.
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return buffer, memoryview(buffer.numpy())  # type: ignore[arg-type]

    def destination(self, span: Span) -> tuple[Any, dict[str, Any]]:
        import torch

        buffer = torch.empty(span.nbytes, dtype=torch.uint8, device=self._device)
        tensors = {}
        for info in span.tensors:
            offset = info.start - span.start
            flat = buffer[offset : offset + info.nbytes]
            tensors[info.name] = flat.view(torch_dtype(info.dtype, tensor=info.name)).reshape(
                info.shape
            )
        return buffer, tensors

    def empty(self, info: TensorInfo) -> Any:
        import torch

        return torch.empty(
            info.shape, dtype=torch_dtype(info.dtype, tensor=info.name), device=self._device
        )

    def submit(self, source: Any, offset: int, target: Any, target_offset: int, nbytes: int) -> Any:
        import torch

        with torch.cuda.stream(self._stream):
            target[target_offset : target_offset + nbytes].copy_(
                source[offset : offset + nbytes], non_blocking=True
            )
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
        return event

    async def wait(self, token: Any) -> None:
        delay = _POLL_FIRST
        while not token.query():
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
