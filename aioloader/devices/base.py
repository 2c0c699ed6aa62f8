"""The interface every destination implements.

A load asks the device for the memory of each span of neighbouring tensors
(``allocate``), for the buffer a read should fill (``staging``) and, once a read
has landed, to move those bytes to their destination (``commit``). A device
whose staging buffer is the destination itself (host memory) has nothing to do
in ``commit``; one with a separate staging area (a GPU) copies from it there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ..plan import Read, Span
from ..safetensors import TensorInfo

__all__ = ["Device", "SpanAllocation"]


class SpanAllocation(ABC):
    """The destination memory of one span."""

    span: Span

    @abstractmethod
    def tensor(self, info: TensorInfo) -> Any:
        """The tensor of ``info`` (one of the span's), handed to the caller when complete."""


class Device(ABC):
    """A kind of destination memory."""

    name: str

    @abstractmethod
    def allocate(self, span: Span) -> SpanAllocation:
        """Memory for every tensor of ``span``; contents undefined until filled."""

    @abstractmethod
    def empty(self, info: TensorInfo) -> Any:
        """A tensor with no elements (nothing to read)."""

    @abstractmethod
    def staging(self, read: Read, allocation: SpanAllocation) -> memoryview:
        """The writable buffer of ``read.nbytes`` bytes that the reader fills."""

    @abstractmethod
    async def commit(self, read: Read, allocation: SpanAllocation, buffer: memoryview) -> None:
        """Move a finished read's bytes from staging to destination."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release device resources; idempotent."""
