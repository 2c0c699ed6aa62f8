"""Pick the destination for ``device=`` and ``framework=`` arguments."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from ..errors import ConfigError
from ..settings.values import Limits
from .base import Device

__all__ = ["FRAMEWORKS", "device_for"]

FRAMEWORKS = ("torch", "numpy", "cupy")


def device_for(device: Any, limits: Limits, framework: str, setup: Executor) -> Device:
    """A Device for ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device``, a Device,
    or a CopyEngine (wrapped in a staging ring sized by ``limits``). Its slow one-off
    calls (importing torch, starting the engine, pinning the ring) run in ``setup``, a
    lane of the caller's (threads.py); a Device given as it is keeps its own.

    Raises:
        ConfigError: the device or framework is unknown or unavailable here.
    """
    if isinstance(device, Device):
        return device
    if not isinstance(device, str):
        # Imported only when it can be one: a load to "cpu" in a new process otherwise
        # paid for the import (2 ms where no bytecode was cached) inside the load.
        from .staged import CopyEngine, StagedDevice

        if isinstance(device, CopyEngine):
            return StagedDevice(device, limits, setup)
    if framework not in FRAMEWORKS:
        raise ConfigError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    text = str(device).lower()
    if text == "cpu":
        if framework == "cupy":
            raise ConfigError("framework='cupy' puts arrays on a GPU: use device='cuda'")
        from .cpu import CpuDevice

        return CpuDevice(framework, setup)
    if text == "cuda" or text.startswith("cuda:"):
        if framework == "numpy":
            raise ConfigError("framework='numpy' gives host arrays: use device='cpu'")
        from .staged import StagedDevice

        if framework == "cupy":
            from .cupy import CupyEngine

            index = int(text.partition(":")[2] or 0)
            return StagedDevice(CupyEngine(index), limits, setup)
        from .cuda import TorchCudaEngine

        return StagedDevice(TorchCudaEngine(device), limits, setup)
    raise ConfigError(
        f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N' (or a torch.device)"
    )
