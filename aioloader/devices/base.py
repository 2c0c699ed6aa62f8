"""The interface every destination implements.

A load asks the device for each tensor's memory (``allocate``), for the buffers
a read should fill (``staging``), and, once a read has landed, to move those
bytes to their destination (``commit``). A device whose staging buffers are the
destination itself (host memory) has nothing to do in ``commit``; one with a
separate staging area (a GPU) copies there and frees the staging bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..plan import Read
from ..safetensors import TensorInfo

__all__ = ["Device", "Allocation"]


class Allocation(ABC):
    """The destination memory of one tensor."""

    info: TensorInfo

    @abstractmethod
    def result(self) -> Any:
        """The finished tensor, handed to the caller (who then owns it)."""


class Device(ABC):
    """A kind of destination memory."""

    name: str

    @abstractmethod
    def allocate(self, info: TensorInfo) -> Allocation:
        """Memory for one whole tensor; its contents are undefined until filled."""

    @abstractmethod
    def staging(self, read: Read, allocations: Sequence[Allocation]) -> list[memoryview]:
        """Writable buffers, one per piece of ``read``, that the reader fills."""

    @abstractmethod
    async def commit(
        self, read: Read, allocations: Sequence[Allocation], buffers: Sequence[memoryview]
    ) -> None:
        """Move a finished read's bytes from staging to destination."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release device resources; idempotent."""
