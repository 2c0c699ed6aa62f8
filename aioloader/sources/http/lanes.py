"""Receive lanes: range bodies received on threads of their own, off the caller's loop.

One core receives range bodies at about 2 GB/s (``recv_into`` and the protocol's
bookkeeping, about 0.5 CPU s per GB), and a fast network delivers more. With
``HttpOptions.receive_lanes`` above one, each range GET goes to one of that many
threads (``aioloader-receive_N``), each running an event loop of its own (uvloop's
when it is installed) with its own RangeClient and connections: the body lands in the
caller's memory from that thread, while the caller's loop only dispatches and waits.
Retries, limits, pacing and the cache stay above, on the caller's loop; a lane runs
``RangeClient.get_into`` and nothing else. With one lane there are no threads: the
caller's loop keeps its own RangeClient (``receiver``).

What crosses threads:

- ``sink`` and ``advance`` are touched by the one lane running the request, and by
  nobody else meanwhile: the caller waits for the lane's task to end, also when it is
  cancelled (``finish_before_cancel``), so no byte lands after ``get_into`` returned
  or raised, and the buffer may be reused at once. A cancelled transfer's connection
  is dropped by the RangeClient, never reused.
- ``accept`` runs in the lane: it must be pure (the transport's checks headers and
  raises). The signing, and the SSL context (which may be shared by threads), are the
  caller's, made before the dispatch.
- What the lane's ``get_into`` returns or raises reaches the caller as it is.
- The caller's loop alone counts the transfers in flight per lane (``in_flight``);
  a lane's tasks are its own loop's alone.

``receive_lanes="auto"`` starts on the caller's loop and moves to lanes once that loop
is measured busy; auto_lanes.py makes each transport's receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any, Protocol

from ...errors import ClosedError
from ...runtime.threads import finish_before_cancel, start_thread
from .client import Answer, RangeClient

__all__ = ["ReceiveLanes", "Receiver"]


Accept = Callable[[Answer], bool]
Arguments = tuple[str, dict[str, str], int, Callable[[], memoryview], Callable[[int], None], Accept]


class Receiver(Protocol):
    """Receives range bodies into caller buffers: a RangeClient, or receive lanes."""

    async def get_into(
        self,
        url: str,
        headers: dict[str, str],
        length: int,
        sink: Callable[[], memoryview],
        advance: Callable[[int], None],
        accept: Accept,
    ) -> Answer | None: ...

    async def aclose(self) -> None: ...


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Transfer:
    """One request on a lane: its task there, and its end as the caller sees it."""

    def __init__(self, caller: asyncio.AbstractEventLoop, arguments: Arguments) -> None:
        self.arguments = arguments
        self.done: asyncio.Future[Answer | None] = caller.create_future()
        self.stopped = False  # the caller was cancelled: its outcome is of no interest
        self._caller = caller
        self._task: asyncio.Task[Answer | None] | None = None

    # on the lane's loop ---------------------------------------------------------------

    def run(self, loop: asyncio.AbstractEventLoop, client: RangeClient) -> asyncio.Task[Any]:
        self._task = loop.create_task(client.get_into(*self.arguments))
        self._task.add_done_callback(self._ended)
        return self._task

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _ended(self, task: asyncio.Task[Answer | None]) -> None:
        answer: Answer | None = None
        error: BaseException | None = None
        if task.cancelled():  # by the caller (who ignores this), or by the lanes' close
            error = ClosedError(
                f"the receive lanes were closed while {self.arguments[0]} was being received"
            )
        else:
            error = task.exception()
            answer = task.result() if error is None else None
        # The caller waits for this (finish_before_cancel), so its loop still runs.
        with contextlib.suppress(RuntimeError):
            self._caller.call_soon_threadsafe(self._settle, answer, error)

    # on the caller's loop -------------------------------------------------------------

    def _settle(self, answer: Answer | None, error: BaseException | None) -> None:
        if self.done.done():
            return
        if error is None or self.stopped:
            self.done.set_result(answer)
        else:
            self.done.set_exception(error)


class _Lane:
    """One thread running one event loop, with its own RangeClient and connections."""

    def __init__(self, index: int, client: RangeClient) -> None:
        self.name = f"receive_{index}"
        self.in_flight = 0  # counted on the caller's loop
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready: Future[None] = Future()  # its loop exists
        self.ended: Future[None] = Future()  # its loop is closed: the thread's last act
        self.thread: threading.Thread | None = None
        self._client = client
        self._tasks: set[asyncio.Task[Any]] = set()  # the lane's loop's alone
        self._closing: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.thread = start_thread(self.name, self._main)

    def _main(self) -> None:
        try:
            loop = self.loop = _new_loop()
        except BaseException as exc:  # handed to the caller, who closes the lanes
            self.ready.set_exception(exc)
            self.ended.set_result(None)
            return
        self.ready.set_result(None)
        try:
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            self.ended.set_result(None)

    def send(self, transfer: _Transfer) -> None:
        """Start ``transfer`` on this lane (from the caller's thread)."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._begin, transfer)

    def cancel(self, transfer: _Transfer) -> None:
        """Cancel ``transfer`` on this lane (from the caller's thread)."""
        assert self.loop is not None
        with contextlib.suppress(RuntimeError):  # closed: every task there has ended
            self.loop.call_soon_threadsafe(transfer.cancel)

    def stop(self) -> None:
        """End the transfers in flight, close the connections, stop the loop."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._stop)

    # on the lane's loop ---------------------------------------------------------------

    def _begin(self, transfer: _Transfer) -> None:
        assert self.loop is not None
        task = transfer.run(self.loop, self._client)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop(self) -> None:
        self._closing = asyncio.ensure_future(self._shutdown())

    async def _shutdown(self) -> None:
        try:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()
            await asyncio.sleep(0)  # the dropped connections' sockets close
        finally:
            asyncio.get_running_loop().stop()  # whatever happened: the thread must end


async def _gone(lane: _Lane) -> None:
    """Return once the lane's thread has ended, without blocking the caller's loop: its
    end is awaited, and the join then returns at once (the signal was its last act)."""
    if lane.thread is not None:
        await asyncio.wrap_future(lane.ended)
        lane.thread.join()


class ReceiveLanes:
    """``count`` receive lanes, started on first use; each request goes to the lane with
    the fewest in flight. Use from one event loop; ``aclose()`` ends the threads.

    Args:
        count: the threads.
        client: makes one lane's RangeClient.
    """

    def __init__(self, count: int, client: Callable[[], RangeClient]) -> None:
        self._count = count
        self._client = client
        self._lanes: list[_Lane] = []
        self._ready: asyncio.Future[None] | None = None
        self._starter: threading.Thread | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        busy = [lane.in_flight for lane in self._lanes]
        return f"<ReceiveLanes {state} count={self._count} in_flight={busy}>"

    async def _started(self) -> list[_Lane]:
        if self._ready is None and not self._closed:
            self._lanes = [_Lane(i, self._client()) for i in range(self._count)]
            ready: Future[None] = Future()
            # One thread start on the loop instead of one per lane: each start waits
            # for the new thread to run, which a busy machine delays (threads.py).
            self._starter = start_thread("receive-start", lambda: self._start_all(ready))
            self._ready = asyncio.wrap_future(ready)
        if self._ready is not None:
            # Shielded: one cancelled caller must not cancel the start others wait for.
            await asyncio.shield(self._ready)
        if self._closed:
            raise ClosedError("the receive lanes are closed (HttpTransport.aclose)")
        return self._lanes

    def _start_all(self, ready: Future[None]) -> None:
        error: BaseException | None = None
        try:
            for lane in self._lanes:
                lane.start()
        except BaseException as exc:  # no thread to be had: close what did start
            error = exc
        # Every lane started has its loop, or has failed, before any can be closed.
        started = [lane.ready for lane in self._lanes if lane.thread is not None]
        wait(started)
        error = error or next((f.exception() for f in started if f.exception()), None)
        if error is not None:
            ready.set_exception(error)
        else:
            ready.set_result(None)

    async def get_into(
        self,
        url: str,
        headers: dict[str, str],
        length: int,
        sink: Callable[[], memoryview],
        advance: Callable[[int], None],
        accept: Accept,
    ) -> Answer | None:
        """``RangeClient.get_into`` on the lane with the fewest transfers in flight.

        Raises:
            WireError: as RangeClient's, and whatever ``accept`` raises, unchanged.
            ClosedError: the lanes were closed before or during the transfer.
        """
        lane = min(await self._started(), key=lambda lane: lane.in_flight)
        transfer = _Transfer(
            asyncio.get_running_loop(), (url, headers, length, sink, advance, accept)
        )

        def stop() -> None:
            transfer.stopped = True
            lane.cancel(transfer)

        lane.in_flight += 1
        try:
            lane.send(transfer)
            return await finish_before_cancel(transfer.done, stop)
        finally:
            lane.in_flight -= 1

    async def aclose(self) -> None:
        """Cancel the transfers in flight, close every connection, end the threads.
        Idempotent; a cancelled close still waits for the threads to end."""
        if self._closed:
            return
        self._closed = True
        if self._ready is not None:
            await finish_before_cancel(asyncio.ensure_future(self._close()))

    async def _close(self) -> None:
        assert self._ready is not None
        with contextlib.suppress(Exception):  # a failed start: close what did start
            await asyncio.shield(self._ready)
        started = [lane for lane in self._lanes if lane.loop is not None]
        for lane in started:
            lane.stop()
        await asyncio.gather(*(_gone(lane) for lane in self._lanes))
        starter, self._starter = self._starter, None
        if starter is not None:
            starter.join()  # at once: setting ``ready``, awaited above, was its last act
