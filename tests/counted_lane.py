"""A lane whose calls are counted: what a path costs the event loop in thread hops."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import ParamSpec, TypeVar

from aioloader.runtime.threads import Lane

P = ParamSpec("P")
T = TypeVar("T")


class CountedLane(Lane):
    """A real lane; ``calls``: the calls handed to it."""

    calls = 0

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        self.calls += 1
        return super().submit(fn, *args, **kwargs)
