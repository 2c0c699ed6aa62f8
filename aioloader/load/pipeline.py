"""One load of an open model (open_model.py): plan, then read every range into its destination.

Everything runs under one ``asyncio.TaskGroup``: ``concurrency`` reader tasks take
reads from the plan, stage each one with the device (budget and buffer), fill it,
and commit it. On host memory the bytes are then in place and the reader hands out
every tensor whose last byte has arrived; on a device with a copy engine one more
task waits for the copies, in submission order, and hands the tensors out. Which
reads this process does itself, and what else runs beside the readers, is the
``Ranks`` strategy's (ranks.py): all of them alone, or a share with ``group=``. When
anything fails or the load is cancelled, every task stops, every file is closed and
every budget byte is returned before the error propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..devices.base import Device, SpanAllocation, Staged
from ..errors import ReadError, SelectionError
from ..format.safetensors import FileHeader, TensorInfo
from ..reads.plan import Read, Span, plan_reads
from ..reads.rows import Rows, narrow, rows_of
from ..reads.staging import ByteBudget, Share
from ..redact import redacting_logger
from ..runtime.tasks import gather
from ..runtime.threads import Lanes, run_blocking
from ..settings.values import Limits
from .open_model import OpenModel, check_layout, open_model
from .report import LoadReport, cache_outcome

if TYPE_CHECKING:
    # A load is given its ranks (Solo, or Group with group=): the ranks, the exchange
    # and the agreement are imported only by the Loader that makes them.
    from ..ranks.strategy import Ranks

# ``open_model`` is the first step of every load: importable from here too.
__all__ = ["Load", "OpenModel", "Progress", "Selection", "open_model"]

logger = redacting_logger(__name__)

Selection = Collection[str] | Callable[[str], bool] | None
Emit = Callable[[str, Any], None]

# Longest stretch the loop spends allocating tensors before letting others run.
_ALLOCATION_SLICE = 0.002
# Models with more tensors than this are planned off the event loop: checking,
# selecting and planning 300,000 tensors held it for 0.7 s.
_PLAN_INLINE = 20_000


def _select(all_tensors: dict[str, TensorInfo], selection: Selection, url: str) -> set[str] | None:
    if selection is None:
        return None
    if callable(selection):
        return {name for name in all_tensors if selection(name)}
    if isinstance(selection, str):
        selection = [selection]
    wanted = set(selection)
    missing = sorted(wanted - all_tensors.keys())
    if missing:
        hints = []
        for name in missing[:5]:
            close = difflib.get_close_matches(name, all_tensors.keys(), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise SelectionError(
            f"{url} has no tensor {', '.join(hints)}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            + f"; it holds {len(all_tensors)} tensors (see `aioloader inspect`)"
        )
    return wanted


@dataclass
class Progress:
    """Live counters of one load, read by statistics() and progress bars."""

    bytes_total: int = 0
    bytes_done: int = 0
    tensors_total: int = 0
    tensors_done: int = 0


@dataclass
class _Plan:
    chosen: list[TensorInfo]
    spans: list[Span]
    reads: list[Read]


class Load:
    """One load of ``model`` into ``device``, calling ``emit`` as each tensor completes;
    ``await Load(...).run()`` returns the report (also logged at INFO) and closes
    ``model``. Its state, and its steps as small methods.

    Raises (from ``run``):
        LoaderError: any failure, naming the file, tensor and byte range.
    """

    def __init__(
        self,
        *,
        url: str,
        model: OpenModel,
        ranks: Ranks,
        device: Device,
        limits: Limits,
        lanes: Lanes,
        budget: ByteBudget,
        selection: Selection,
        emit: Emit,
        progress: Progress,
        on_metadata: Callable[[dict[str, str]], None] | None,
        rows: Rows = None,
    ) -> None:
        self.url = url
        self.ranks = ranks
        self.model = model
        self.layout = model.layout
        self.device = device
        self.limits = limits
        self.lanes = lanes
        self.share = Share(budget)
        self.selection = selection
        self.rows = rows
        self.emit = emit
        self.progress = progress
        self.on_metadata = on_metadata
        self.blobs = model.blobs
        self.allocations: dict[Span, SpanAllocation] = {}
        self.waiting_on: dict[str, int] = {}  # tensor -> reads still to land
        self.copying: asyncio.Queue[Staged] = asyncio.Queue()
        self.copy_seconds = 0.0
        self._copy_free_at = 0.0
        self.started = time.perf_counter()
        self.header_done = self.read_started = self.last_read_done = self.started

    async def run(self) -> LoadReport:
        headers = self.model.headers
        async with self.model:
            try:
                plan = await self._make_plan(headers)
            except BaseException as exc:
                await self.ranks.announce_failure(exc)
                raise
            own = await self.ranks.assign(plan.reads, self.blobs, headers)
            self.header_done = time.perf_counter()
            # Imports and (for a GPU) the device's context are set up in a thread
            # before the first tensor is allocated; not part of the read time.
            await self.device.prepare()
            await self._allocate(plan)
            self.read_started = self.last_read_done = time.perf_counter()
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s: reading %d tensors (%d bytes) in %d reads",
                    self.url,
                    len(plan.chosen),
                    sum(r.nbytes for r in own),
                    len(own),
                )
            await self._transfer(own)
            # A file rewritten in place mid-load would hand out a mix of two versions.
            await gather(self.blobs[i].check_unchanged() for i in {r.span.file for r in own})
        return self._report(len(headers), len(plan.chosen))

    async def _make_plan(self, headers: Sequence[FileHeader]) -> _Plan:
        if self.on_metadata is not None:
            merged: dict[str, str] = {}
            for header in headers:
                merged.update(header.metadata)
            self.on_metadata(merged)
        if sum(len(h.tensors) for h in headers) <= _PLAN_INLINE:
            return self._plan(headers)
        # Pure work; a tensors= predicate is then called in that thread too.
        return await run_blocking(self.lanes.compute, lambda: self._plan(headers))

    def _plan(self, headers: Sequence[FileHeader]) -> _Plan:
        all_tensors = check_layout(self.layout, headers)
        wanted = _select(all_tensors, self.selection, self.url)
        chosen = [t for h in headers for t in h.tensors if wanted is None or t.name in wanted]
        cut = rows_of(chosen, self.rows, self.url)
        if cut:
            headers = [
                replace(h, tensors=tuple(narrow(t, *cut[t.name]) if t.name in cut else t
                                         for t in h.tensors))
                for h in headers
            ]  # fmt: skip
            chosen = [narrow(t, *cut[t.name]) if t.name in cut else t for t in chosen]
        spans, reads = plan_reads(
            headers, wanted, self.limits.read_size, alone=cut.keys(), room=self.device.room
        )
        self.progress.tensors_total = len(chosen)
        self.progress.bytes_total = sum(t.nbytes for t in chosen)
        # A tensor is complete once every read overlapping it has landed.
        for read in reads:
            for tensor in read.tensors:
                self.waiting_on[tensor.name] = self.waiting_on.get(tensor.name, 0) + 1
        return _Plan(chosen, spans, reads)

    async def _allocate(self, plan: _Plan) -> None:
        # Memory for every span is reserved before the first read: an mmap()
        # while readers are faulting pages in waits for the address-space lock,
        # and on the event loop that wait would stall everything else.
        slice_started = time.perf_counter()
        for span in plan.spans:
            self.allocations[span] = self.device.allocate(span)
            if time.perf_counter() - slice_started > _ALLOCATION_SLICE:
                await asyncio.sleep(0)  # thousands of tensors: let others run
                slice_started = time.perf_counter()
        for tensor in plan.chosen:
            if tensor.nbytes == 0:
                self.emit(tensor.name, self.device.empty(tensor))
                self.progress.tensors_done += 1

    async def _transfer(self, reads: list[Read]) -> None:
        pending = iter(reads)
        workers = [self._reader(pending) for _ in range(min(self.limits.concurrency, len(reads)))]
        if self.device.copies:
            workers.append(self._completer(len(reads)))
        workers += self.ranks.workers(self.allocations, self._landed)
        try:
            await gather(workers)
        finally:
            # Committed reads whose copies were never waited for still hold staging
            # and budget; a copy may still be reading its slot: let it finish.
            while not self.copying.empty():
                staged = self.copying.get_nowait()
                with contextlib.suppress(Exception):
                    await self.device.finish(staged)

    async def _reader(self, pending: Iterator[Read]) -> None:
        device = self.device
        for read in pending:
            async with device.stage(read, self.allocations[read.span], self.share) as staged:
                assert staged.buffer is not None
                try:
                    await self._read(read, staged.buffer)
                except BaseException as exc:
                    self.ranks.failed(exc)
                    raise
                device.commit(staged)
            self.last_read_done = time.perf_counter()
            if device.copies:
                self.copying.put_nowait(staged)
            else:
                await device.finish(staged)
                self._own_landed(read)

    async def _read(self, read: Read, buffer: memoryview) -> None:
        try:
            await self.blobs[read.span.file].read_into(read.start, [buffer])
        except ReadError as exc:
            raise type(exc)(
                f"{exc}; while loading {read.describe()}",
                url=read.url,
                start=read.start,
                end=read.end,
                tensors=tuple(t.name for t in read.tensors),
            ) from exc

    async def _completer(self, count: int) -> None:
        # Copies run one after another on the device's stream, in the order the
        # readers committed them: wait for them in that order.
        for _ in range(count):
            staged = await self.copying.get()
            submitted = time.perf_counter()
            await self.device.finish(staged)
            done = time.perf_counter()
            # Time the copy engine was busy, at most since this copy was waited for.
            self.copy_seconds += done - max(submitted, self._copy_free_at)
            self._copy_free_at = done
            self._own_landed(staged.read)

    def _own_landed(self, read: Read) -> None:
        """A read of this process's own is in place (the ranks' exchange may send it)."""
        self._landed(read)
        self.ranks.landed(read)

    def _landed(self, read: Read) -> None:
        """Hand out every tensor of ``read`` whose last byte is now in place."""
        allocation = self.allocations[read.span]
        progress = self.progress
        for tensor in read.tensors:
            self.waiting_on[tensor.name] -= 1
            if self.waiting_on[tensor.name] == 0:
                del self.waiting_on[tensor.name]
                progress.tensors_done += 1
                progress.bytes_done += tensor.nbytes
                self.emit(tensor.name, allocation.tensor(tensor))

    def _report(self, files: int, tensors: int) -> LoadReport:
        finished = time.perf_counter()
        report = LoadReport(
            url=self.url,
            device=self.device.name,
            files=files,
            tensors=tensors,
            bytes=self.progress.bytes_total,
            header_seconds=self.header_done - self.started,
            read_seconds=max(0.0, self.last_read_done - self.read_started),
            copy_seconds=self.copy_seconds,
            total_seconds=finished - self.started,
            peak_staging_bytes=self.share.peak,
            settings=self.limits.as_dict(),
            own_bytes=self.ranks.own_bytes,
            cache=cache_outcome(self.blobs),
        )
        logger.info("%s", report.summary())
        if report.copy_seconds and report.total_seconds > 1.0 and report.overlap < 0.5:
            logger.warning(
                "%s: reads and copies overlapped only %.0f%%; %s",
                self.url,
                report.overlap * 100,
                report.advice(),
            )
        return report
