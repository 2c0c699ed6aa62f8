"""The interface every destination implements.

A load asks the device for the memory of each span of neighbouring tensors
(``allocate``), for the buffer a read should fill (``staging``) and, once a read
has landed, to move those bytes to their destination (``submit``, then ``wait``
for that copy). A device whose staging buffer is the destination itself (host
memory) has nothing to submit; one with a separate staging ring (a GPU) starts
an asynchronous copy and frees the staging slot when it has completed.
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

    async def stage(self, read: Read, allocation: SpanAllocation) -> memoryview:
        """The buffer the reader fills with ``read``'s bytes, once one is free."""
        return self.staging(read, allocation)

    def cost(self, read: Read) -> int:
        """Staging budget bytes a read holds from ``staging`` until its copy completes."""
        return read.nbytes

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """Set up staging memory before the first read (called once per load)."""

    def submit(self, read: Read, allocation: SpanAllocation, buffer: memoryview) -> Any:
        """Start moving a finished read's bytes to their destination; returns a token."""
        return None

    async def wait(self, read: Read, token: Any) -> None:  # noqa: B027 - optional hook
        """Return when the move started by ``submit`` is complete; frees its staging."""

    def release(self, read: Read) -> None:  # noqa: B027 - optional hook
        """Free the staging of a read that will never be submitted (failure, cancellation)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release device resources; idempotent."""
