"""``TensorStream``: the tensors of one load, handed out as each completes."""

from __future__ import annotations

import asyncio
import contextvars
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..errors import ClosedError
from ..reads.kept import HANDED_OUT
from ..runtime.tasks import first_error
from .pipeline import Progress
from .report import LoadReport

__all__ = ["Run", "StreamStatistics", "TensorStream"]

_DONE = object()

#: Runs a load: ``run(emit, progress, on_metadata)`` returns its report.
Run = Callable[
    [Callable[[str, Any], None], Progress, Callable[[dict[str, str]], None]],
    Coroutine[Any, Any, LoadReport],
]


@dataclass(frozen=True)
class StreamStatistics:
    """Progress of one stream."""

    bytes_total: int
    bytes_done: int
    tensors_total: int
    tensors_done: int


class TensorStream:
    """An async iterator of ``(name, tensor)`` in the order tensors complete.

    Use it as ``async with loader.stream(url) as stream: async for name, t in stream``.
    Leaving the block (or ``aclose()``) before the end stops every reader. Each
    tensor handed out belongs to the caller: the loader never writes to it again.

    A file checked against its publisher's digest (``hf://``, an ``s3://`` object with
    a checksum: docs/remote-storage.md) hands its tensors out as they land, before
    the digest is complete: the stream raises ``DigestMismatchError`` once that
    file's last byte has arrived, and what it handed out of the file is to be dropped.

    Attributes:
        report: the LoadReport, once the stream is exhausted.
        metadata: the merged ``__metadata__``, once the headers have been read.
    """

    def __init__(self, name: str, run: Run, forget: Callable[[TensorStream], None]) -> None:
        self._name = name
        self._run = run
        self._forget = forget
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[LoadReport] | None = None
        self._progress = Progress()
        self._closed = False
        self._group: asyncio.TaskGroup | None = None
        self.report: LoadReport | None = None
        self.metadata: dict[str, str] | None = None

    def __repr__(self) -> str:
        p = self._progress
        state = "closed" if self._closed else "running" if self._task else "new"
        return (
            f"<TensorStream {self._name!r} {state} "
            f"tensors={p.tensors_done}/{p.tensors_total} bytes={p.bytes_done}/{p.bytes_total}>"
        )

    def statistics(self) -> StreamStatistics:
        p = self._progress
        return StreamStatistics(p.bytes_total, p.bytes_done, p.tensors_total, p.tensors_done)

    def _start(self) -> None:
        if self._closed:
            raise ClosedError(f"this stream of {self._name} is closed")
        if self._task is not None:
            return
        coro = self._run(self._emit, self._progress, self._meta)
        name = f"aioloader load {self._name}"
        context = contextvars.copy_context()
        context.run(HANDED_OUT.set, True)  # its tensors go out as they land (kept.py)
        if self._group is not None:
            self._task = self._group.create_task(coro, name=name, context=context)
        else:  # iterated without ``async with``: aclose() (or the Loader's) ends it
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(coro, name=name, context=context)
        self._task.add_done_callback(lambda _: self._queue.put_nowait(_DONE))

    def _emit(self, name: str, tensor: Any) -> None:
        self._queue.put_nowait((name, tensor))

    def _meta(self, metadata: dict[str, str]) -> None:
        self.metadata = metadata

    async def __aenter__(self) -> TensorStream:
        # The load runs as a task of a TaskGroup that this block owns: if the load
        # fails, the block is interrupted at once, and it never outlives the block.
        group = asyncio.TaskGroup()
        await group.__aenter__()
        self._group = group
        try:
            self._start()
        except BaseException as exc:
            self._group = None
            await group.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        await self.aclose()
        group, self._group = self._group, None
        if group is None:
            return False
        try:
            await group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as eg:
            if exc is not None and eg.exceptions == (exc,):
                return False  # the block's own error, as it was raised
            error = first_error(eg)
            raise error from error.__cause__
        return False

    def __aiter__(self) -> TensorStream:
        return self

    async def __anext__(self) -> tuple[str, Any]:
        self._start()
        item = await self._queue.get()
        if item is _DONE:
            assert self._task is not None
            self._closed = True
            self._forget(self)
            self.report = self._task.result()
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Stop the load (if still running) and release everything it held; idempotent."""
        self._closed = True
        self._forget(self)
        task = self._task
        if task is None:
            return
        if not task.done():
            task.cancel()
        try:
            await asyncio.wait([task])
        finally:
            if task.done() and not task.cancelled():
                task.exception()  # an error nobody iterated to is not re-raised here

    def __del__(self, _warn: Any = warnings.warn) -> None:
        task = self._task
        if task is not None and not task.done():
            _warn(
                f"{self!r} was never closed; use `async with loader.stream(...)`",
                ResourceWarning,
                stacklevel=1,
            )
