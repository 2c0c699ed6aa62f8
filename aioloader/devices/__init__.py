"""Where the bytes go: one module per kind of destination memory, picked by ``auto``."""

from __future__ import annotations

from .base import Device

__all__ = ["Device"]
