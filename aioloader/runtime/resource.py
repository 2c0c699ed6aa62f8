"""``AsyncResource``: what ``async with`` does for every object that has an ``aclose``.

An object that holds something to release (threads, sources, a task) defines
``aclose``, idempotent; deriving from this base makes ``async with obj:`` close it
on the way out, whatever the body raised (the exception passes through).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["AsyncResource"]


class AsyncResource(ABC):
    """A resource released by ``aclose``, usable as ``async with resource:``."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @abstractmethod
    async def aclose(self) -> None:
        """Release what this object holds; idempotent."""
