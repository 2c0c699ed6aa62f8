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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ..format.safetensors import TensorInfo
from ..reads.kept import BUFFERS_KEPT, HANDED_OUT
from ..reads.plan import Read, Span
from ..reads.staging import Share
from ..runtime.container_memory import MemoryLimit

__all__ = ["Device", "SpanAllocation", "Staged"]


class SpanAllocation(ABC):
    """The destination memory of one span."""

    span: Span

    @abstractmethod
    def tensor(self, info: TensorInfo) -> Any:
        """The tensor of ``info`` (one of the span's), handed to the caller when complete."""


class Staged:
    """A read from ``Device.stage`` until ``Device.finish``: its buffer and the budget it holds.

    Attributes:
        read: the byte range.
        buffer: where the reader puts its bytes.
        token: the device's handle on the move to the destination, once committed.
    """

    __slots__ = ("allocation", "buffer", "committed", "cost", "read", "share", "token")

    def __init__(self, read: Read, allocation: SpanAllocation, cost: int, share: Share) -> None:
        self.read = read
        self.allocation = allocation
        self.cost = cost
        self.share = share
        self.buffer: memoryview | None = None
        self.token: Any = None
        self.committed = False


class Device(ABC):
    """A kind of destination memory.

    The budget rule lives in ``stage`` and ``finish``: a read holds ``cost(read)`` bytes
    of its load's share from the moment it is staged until its bytes are in their
    destination (``finish``), or until it is dropped uncommitted (error, cancellation).
    """

    name: str
    #: Whether bytes move again after they land (a staging ring and a copy engine);
    #: then ``finish`` waits for that move. Host memory is filled in place.
    copies: bool = False
    #: The most memory the tensors of one load may take there, where it is known (host
    #: memory: what this process may use); a load that asks for more is refused before
    #: its reads are planned (room.py). None: not known before allocating.
    room: MemoryLimit | None = None

    @abstractmethod
    def allocate(self, span: Span) -> SpanAllocation:
        """Memory for every tensor of ``span``; contents undefined until filled."""

    @abstractmethod
    def empty(self, info: TensorInfo) -> Any:
        """A tensor with no elements (nothing to read)."""

    @abstractmethod
    async def staging(self, read: Read, allocation: SpanAllocation) -> memoryview:
        """The writable buffer of ``read.nbytes`` bytes that the reader fills, once one is
        free; ``release(read)`` gives it back unfilled."""

    @asynccontextmanager
    async def stage(
        self, read: Read, allocation: SpanAllocation, share: Share
    ) -> AsyncIterator[Staged]:
        """Budget and a buffer for ``read``; fill ``staged.buffer``, then ``commit``.

        Leaving the block uncommitted (an error, a cancellation) gives both back; a
        committed read keeps them until ``finish``.
        """
        staged = Staged(read, allocation, self.cost(read), share)
        await share.acquire(staged.cost)
        # Host memory filled in place keeps its bytes until the load returns (kept.py).
        kept = BUFFERS_KEPT.set(not self.copies and not HANDED_OUT.get())
        try:
            staged.buffer = await self.staging(read, allocation)
            yield staged
        finally:
            BUFFERS_KEPT.reset(kept)
            if not staged.committed:
                if staged.buffer is not None:
                    self.release(read)
                share.release(staged.cost)

    def commit(self, staged: Staged) -> None:
        """The buffer holds the read's bytes: start moving them to their destination."""
        assert staged.buffer is not None
        staged.token = self.submit(staged.read, staged.allocation, staged.buffer)
        staged.committed = True

    async def finish(self, staged: Staged) -> None:
        """Wait until a committed read's bytes are in their destination; free its staging."""
        try:
            await self.wait(staged.read, staged.token)
        finally:
            staged.share.release(staged.cost)

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
