"""Running coroutines together, with the first real error instead of a group; and
``Shared``, one call of a coroutine function serving every caller that waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

__all__ = ["Shared", "first_error", "gather"]


async def gather(coros: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Run coroutines in a TaskGroup; raise the first real error, not a group.

    When one fails the others are cancelled and waited for, as a TaskGroup does.
    """
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except BaseExceptionGroup as eg:
        error = first_error(eg)
        # Keep the error's own cause; the group around it is noise.
        raise error from error.__cause__


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception in ``group`` (nested groups searched) that is not a cancellation."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return first_error(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]


class Shared:
    """Calls of ``fn`` (a coroutine function taking nothing), one at a time, shared.

    ``await shared()`` returns once a call of ``fn`` that began after it was awaited
    has ended: what that call reads is as new as the caller asked for. Callers that
    arrive while a call runs share the next one, so however many wait, at most one
    call runs and one more is due. The caller whose turn starts the call gets its
    error; the others, who shared it, return and may ask again.
    """

    def __init__(self, fn: Callable[[], Awaitable[object]]) -> None:
        self._fn = fn
        self._lock = asyncio.Lock()
        self._begun = 0  # calls begun
        self._ended = 0  # the last call ended (its number)

    def __repr__(self) -> str:
        return f"<Shared {getattr(self._fn, '__qualname__', self._fn)!r} calls={self._begun}>"

    async def __call__(self) -> None:
        due = self._begun + 1  # the first call to begin after this point serves
        async with self._lock:
            if self._ended >= due:
                return  # one began after the ask and ended while this waited
            self._begun += 1
            number = self._begun
            try:
                await self._fn()
            finally:
                self._ended = number
