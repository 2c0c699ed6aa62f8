"""Where the bytes come from: one module per kind of storage, picked by ``auto``."""

from __future__ import annotations

from .base import Blob, Source

__all__ = ["Blob", "Source"]
