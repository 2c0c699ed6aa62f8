"""``with Server() as server:`` for the test servers: started on entry, stopped on exit."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["StartStop"]


class StartStop:
    """A server that ``with`` starts and stops; subclasses give ``start`` and ``stop``."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
