"""Running a coroutine to completion from code that is not async: the one bridge,
for ``load_model_sync``, the ``aioloader`` command and vLLM's hooks.

Where the event loop runs depends on where the caller stands:

* ``run``: on the caller's thread, on a fresh event loop (as ``asyncio.run``; the
  CLI passes uvloop's loop). A thread whose event loop is running is refused with
  EventLoopError: the call would block that loop, and a loop cannot run inside
  another. ``main`` is called on the caller's thread after that check and before
  the loop starts, so what it checks to make its coroutine (options) fails without
  a loop. Ctrl-C on the main thread cancels the coroutine, which closes what it
  opened, and raises KeyboardInterrupt.
* ``run_beside``: on a fresh event loop in a thread of its own, ``aioloader-sync``,
  the caller blocked until it ends. For a caller that must block and may stand on
  a running loop's thread (vLLM's worker is synchronous and may own a loop: its
  loop waits meanwhile, as for any blocking call made there). Ctrl-C while it
  waits cancels the coroutine, waits for it to close what it opened, and raises
  KeyboardInterrupt.
* ``LoopThread``: that thread and its loop, for a caller that talks to the
  coroutine meanwhile (vllm.py's weight stream: tensors come through a queue, the
  consumer releases its window with ``call_soon``).

Every thread here is started by ``threads.start_thread`` (the thread policy) and
joined before the call returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from ..errors import EventLoopError
from .threads import start_thread

__all__ = ["LoopThread", "run", "run_beside"]

T = TypeVar("T")
Main = Callable[[], Coroutine[Any, Any, T]]


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run(
    main: Main[T],
    *,
    caller: str,
    instead: str,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """``main()``'s coroutine run to completion on a fresh loop on this thread.

    Args:
        main: makes the coroutine; called only once the check has passed.
        caller: what the user called, for the refusal (``"load_model_sync()"``).
        instead: what to do on a running loop's thread, for the refusal.
        loop_factory: makes the loop (uvloop's); None: asyncio's.

    Raises:
        EventLoopError: this thread runs an event loop.
    """
    if _loop_running():
        raise EventLoopError(
            f"{caller} was called on the thread of a running event loop, which it would "
            f"block; {instead}"
        )
    coroutine = main()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(coroutine)


def run_beside(main: Main[T], *, name: str = "sync") -> T:
    """``main()``'s coroutine run to completion on a fresh loop in a thread of its own
    (``aioloader-<name>``), from any thread, a running loop's included; see the module."""
    return LoopThread(main, name=name).result()


class LoopThread(Generic[T]):
    """``main()``'s coroutine, run on a fresh event loop in the thread
    ``aioloader-<name>``, started at once.

    Args:
        main: makes the coroutine; called in that thread.
        name: the thread's lane.
        on_exit: called in that thread once the loop has closed, however it ended
            (a consumer waiting on a queue learns that nothing more comes).
    """

    def __init__(
        self, main: Main[T], *, name: str = "sync", on_exit: Callable[[], object] | None = None
    ) -> None:
        self._main = main
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._outcome: list[Any] = []
        self._error: list[BaseException] = []
        self._running = threading.Event()
        self._thread = start_thread(name, self._serve)
        self._running.wait()

    def _serve(self) -> None:
        try:
            self._outcome.append(asyncio.run(self._body()))
        except BaseException as exc:  # raised to whoever asks for the result
            self._error.append(exc)
        finally:
            self._running.set()
            if self._on_exit is not None:
                self._on_exit()

    async def _body(self) -> T:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._running.set()
        return await self._main()

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the thread's loop, from any thread; nothing once it has ended."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn)

    def cancel(self) -> None:
        """Cancel the coroutine (it closes what it opened); ``join`` waits for that."""
        task = self._task
        if task is not None and self._thread.is_alive():
            self.call_soon(task.cancel)

    def join(self) -> None:
        """Wait for the thread to end. Ctrl-C meanwhile cancels the coroutine, waits for
        it to end, and raises KeyboardInterrupt."""
        try:
            self._thread.join()
        except KeyboardInterrupt:
            self.cancel()
            while self._thread.is_alive():
                with contextlib.suppress(KeyboardInterrupt):
                    self._thread.join()
            raise

    def result(self) -> T:
        """Wait for the end (``join``); the coroutine's result, or its error raised."""
        self.join()
        if self._error:
            raise self._error[0]
        return self._outcome[0]  # type: ignore[no-any-return]
