"""Pick the destination for a ``device=`` argument."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Device

__all__ = ["device_for"]


def device_for(device: Any) -> Device:
    """A Device for ``"cpu"``, a ``torch.device``, or an existing Device.

    Raises:
        ConfigError: the device is not one this version can fill.
    """
    if isinstance(device, Device):
        return device
    text = str(device).lower()
    if text == "cpu":
        from .cpu import CpuDevice

        return CpuDevice()
    raise ConfigError(
        f"device {device!r} is not supported by this version of aioloader; it loads into "
        "host memory (device='cpu'): move the tensors afterwards with .to(device)"
    )
