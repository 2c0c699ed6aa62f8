"""Running blocking calls off the event loop, safely under cancellation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class SharedPool:
    """A thread pool shared by the whole process, started on first use.

    Its threads are not daemon threads: a process that exits normally finishes
    what was submitted (Python joins them before it shuts down).
    """

    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self._name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix=self._name)
            return self._executor


async def run_blocking(
    executor: Executor | None,
    fn: Callable[[], T],
    on_abandon: Callable[[T], object] | None = None,
) -> T:
    """Run ``fn`` in ``executor`` and return its result.

    A thread cannot be interrupted. If the caller is cancelled, this still waits
    for ``fn`` to return before re-raising, so no file descriptor is closed and no
    buffer is handed out while a thread may still be using it. Each call is one
    bounded read, so the wait is short. ``on_abandon`` receives a result that
    arrived after the caller was cancelled (e.g. to close a file it opened).
    """
    future = asyncio.get_running_loop().run_in_executor(executor, fn)
    try:
        return await finish_before_cancel(future)
    except asyncio.CancelledError:
        if not future.cancelled() and future.exception() is None and on_abandon is not None:
            on_abandon(future.result())
        raise


async def finish_before_cancel(future: asyncio.Future[T]) -> T:
    """Await ``future``; when cancelled meanwhile, wait for it to finish, then re-raise.

    For work that cannot be called back (a thread's read, a copy on a GPU stream):
    its resources must not be reused while it may still touch them.
    """
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        raise
