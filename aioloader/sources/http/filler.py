"""Consecutive caller buffers filled by a stream of bytes: the only copy a remote read makes."""

from __future__ import annotations

from collections.abc import Sequence

from .retry import RetryableError

__all__ = ["Filler"]


class Filler:
    """Copies a stream of byte chunks into consecutive buffers.

    Args:
        buffers: filled back to back; their sizes add up to ``total``.
    """

    def __init__(self, buffers: Sequence[memoryview]) -> None:
        self._buffers = [b.cast("B") if b.format != "B" else b for b in buffers]
        self._index = 0
        self._offset = 0
        self.total = sum(b.nbytes for b in self._buffers)
        self.written = 0

    @property
    def remaining(self) -> int:
        return self.total - self.written

    def current(self) -> memoryview:
        """The free part of the buffer being filled (for reads straight into it)."""
        return self._buffers[self._index][self._offset :]

    def advance(self, nbytes: int) -> None:
        """Count ``nbytes`` written into ``current()``."""
        self._offset += nbytes
        self.written += nbytes
        if self._offset == self._buffers[self._index].nbytes and self.written < self.total:
            self._index += 1
            self._offset = 0

    def write(self, chunk: bytes | memoryview) -> None:
        """Copy ``chunk`` in after the bytes written so far.

        Raises:
            RetryableError: ``chunk`` reaches past the last buffer (the server sent
                more than asked).
        """
        if len(chunk) > self.remaining:
            raise RetryableError(f"server sent {len(chunk) - self.remaining} bytes more than asked")
        view = memoryview(chunk)
        while view.nbytes:
            target = self._buffers[self._index]
            n = min(view.nbytes, target.nbytes - self._offset)
            target[self._offset : self._offset + n] = view[:n]
            view = view[n:]
            self._offset += n
            self.written += n
            if self._offset == target.nbytes:
                self._index += 1
                self._offset = 0
