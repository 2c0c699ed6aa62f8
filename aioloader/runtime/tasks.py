"""Running coroutines together, with the first real error instead of a group."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any

__all__ = ["first_error", "gather"]


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
