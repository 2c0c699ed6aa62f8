"""One load: open files, read headers, plan, then readers -> staging -> consumer.

Everything runs under one ``asyncio.TaskGroup``: ``concurrency`` reader tasks
take reads from the plan, wait for staging budget, fill the buffers the device
hands them, and queue the filled read. One consumer task commits each read to
the device, returns its budget, and hands out every tensor whose last byte has
arrived. When anything fails or the load is cancelled, every task stops, every
file is closed and every budget byte is returned before the error propagates.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from .config import Limits
from .devices.base import Device, SpanAllocation
from .errors import FormatError, HeaderError, NotFoundError, ReadError, SelectionError
from .layout import ModelLayout
from .plan import Read, Span, plan_reads
from .report import LoadReport
from .safetensors import (
    PREFIX_SIZE,
    FileHeader,
    TensorInfo,
    parse_header,
    parse_header_length,
)
from .sources.base import Blob, Source, aclose_all
from .staging import ByteBudget

__all__ = ["Selection", "load_headers", "run_load"]

logger = logging.getLogger("aioloader")

Selection = Collection[str] | Callable[[str], bool] | None
Emit = Callable[[str, Any], None]

# One read at the start of each file usually holds the whole header.
_HEADER_PROBE = 64 * 1024
# Longest stretch the loop spends allocating tensors before letting others run.
_ALLOCATION_SLICE = 0.002
# Headers above this size are parsed off the event loop.
_PARSE_INLINE = 256 * 1024


async def _read_header(blob: Blob) -> FileHeader:
    first = await blob.read_bytes(0, min(blob.size, _HEADER_PROBE))
    length = parse_header_length(first, blob.url, blob.size)
    end = PREFIX_SIZE + length
    raw = first[PREFIX_SIZE:end]
    if len(first) < end:
        raw += await blob.read_bytes(len(first), end - len(first))
    if len(raw) != length:
        raise HeaderError(f"{blob.url}: file ended inside its {length}-byte header")
    if length > _PARSE_INLINE:
        return await asyncio.to_thread(parse_header, raw, blob.url, blob.size)
    return parse_header(raw, blob.url, blob.size)


async def load_headers(
    source: Source, layout: ModelLayout, concurrency: int
) -> tuple[list[Blob], list[FileHeader]]:
    """Open every file of ``layout`` and parse its header, ``concurrency`` at a time.

    On error every opened file is closed again before the error propagates.
    """
    limiter = asyncio.Semaphore(concurrency)
    blobs: list[Blob | None] = [None] * len(layout.files)
    headers: list[FileHeader | None] = [None] * len(layout.files)

    async def one(i: int, url: str) -> None:
        async with limiter:
            try:
                blobs[i] = await source.open(url)
            except NotFoundError as exc:
                if layout.index is None:
                    raise
                raise NotFoundError(
                    f"{layout.index} names shard {url}, which does not exist; download "
                    "the complete model (every shard the index lists)"
                ) from exc
            headers[i] = await _read_header(blobs[i])  # type: ignore[arg-type]

    try:
        await _gather(one(i, url) for i, url in enumerate(layout.files))
    except BaseException:
        await aclose_all(b for b in blobs if b is not None)
        raise
    return [b for b in blobs if b is not None], [h for h in headers if h is not None]


async def _gather(coros: Any) -> None:
    """Run coroutines in a TaskGroup; raise the first real error, not a group."""
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except BaseExceptionGroup as eg:
        error = _first_error(eg)
        # Keep the error's own cause; the group around it is noise.
        raise error from error.__cause__


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]


def _check_layout(layout: ModelLayout, headers: Sequence[FileHeader]) -> dict[str, TensorInfo]:
    """Every tensor once across shards, and where the index says it is."""
    found: dict[str, TensorInfo] = {}
    where: dict[str, str] = {}
    for header in headers:
        for tensor in header.tensors:
            if tensor.name in found:
                raise FormatError(
                    f"tensor {tensor.name!r} appears in both {where[tensor.name]} and "
                    f"{header.url}; shards must not repeat tensors"
                )
            found[tensor.name] = tensor
            where[tensor.name] = header.url
    if layout.weight_map is not None:
        for name, url in layout.weight_map.items():
            if where.get(name) != url:
                actual = f"is in {where[name]}" if name in where else "is in no shard"
                raise FormatError(
                    f"{layout.index} maps tensor {name!r} to {url}, but it {actual}; the "
                    "index and the shards come from different versions: download them again"
                )
    return found


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
class _Progress:
    """Live counters of one load, read by statistics() and progress bars."""

    bytes_total: int = 0
    bytes_done: int = 0
    tensors_total: int = 0
    tensors_done: int = 0


async def run_load(
    *,
    url: str,
    source: Source,
    layout: ModelLayout,
    device: Device,
    limits: Limits,
    budget: ByteBudget,
    selection: Selection,
    emit: Emit,
    progress: _Progress | None = None,
    on_metadata: Callable[[dict[str, str]], None] | None = None,
) -> LoadReport:
    """Load the tensors of ``layout`` into ``device``, calling ``emit`` as each completes.

    Returns:
        The report of the load (also logged at INFO).

    Raises:
        LoaderError: any failure, naming the file, tensor and byte range.
    """
    progress = progress or _Progress()
    started = time.perf_counter()
    blobs, headers = await load_headers(source, layout, limits.concurrency)
    try:
        all_tensors = _check_layout(layout, headers)
        if on_metadata is not None:
            merged: dict[str, str] = {}
            for header in headers:
                merged.update(header.metadata)
            on_metadata(merged)
        wanted = _select(all_tensors, selection, url)
        spans, reads = plan_reads(headers, wanted, limits.read_size)
        chosen = [t for h in headers for t in h.tensors if wanted is None or t.name in wanted]
        progress.tensors_total = len(chosen)
        progress.bytes_total = sum(t.nbytes for t in chosen)
        header_done = time.perf_counter()

        # Imports and (for a GPU) the device's context are set up in a thread
        # before the first tensor is allocated.
        await device.prepare()
        # Memory for every span is reserved before the first read: an mmap()
        # while readers are faulting pages in waits for the address-space lock,
        # and on the event loop that wait would stall everything else.
        allocations: dict[Span, SpanAllocation] = {}
        slice_started = time.perf_counter()
        for span in spans:
            allocations[span] = device.allocate(span)
            if time.perf_counter() - slice_started > _ALLOCATION_SLICE:
                await asyncio.sleep(0)  # thousands of tensors: let others run
                slice_started = time.perf_counter()
        for tensor in chosen:
            if tensor.nbytes == 0:
                emit(tensor.name, device.empty(tensor))
                progress.tensors_done += 1
        # A tensor is complete once every read overlapping it has landed.
        waiting_on: dict[str, int] = {}
        for read in reads:
            for tensor in read.tensors:
                waiting_on[tensor.name] = waiting_on.get(tensor.name, 0) + 1

        landed: asyncio.Queue[tuple[Read, memoryview]] = asyncio.Queue()
        copying: asyncio.Queue[tuple[Read, Any, float]] = asyncio.Queue()
        pending = iter(reads)
        copy_seconds = 0.0
        copy_free_at = 0.0
        last_read_done = header_done
        staged = peak_staged = 0

        async def reader() -> None:
            nonlocal last_read_done, staged, peak_staged
            for read in pending:
                cost = device.cost(read)
                await budget.acquire(cost)
                staged += cost
                peak_staged = max(peak_staged, staged)
                handed_over = False
                try:
                    buffer = await device.stage(read, allocations[read.span])
                    try:
                        await blobs[read.span.file].read_into(read.start, [buffer])
                    except ReadError as exc:
                        raise type(exc)(
                            f"{exc}; while loading {read.describe()}",
                            url=read.url,
                            start=read.start,
                            end=read.end,
                            tensors=tuple(t.name for t in read.tensors),
                        ) from exc
                    landed.put_nowait((read, buffer))
                    handed_over = True
                    last_read_done = time.perf_counter()
                finally:
                    if not handed_over:
                        device.release(read)
                        staged -= cost
                        budget.release(cost)

        async def submitter() -> None:
            # Copies start in the order reads land; a GPU runs them on one stream
            # while the readers go on filling other slots.
            for _ in range(len(reads)):
                read, buffer = await landed.get()
                token = device.submit(read, allocations[read.span], buffer)
                copying.put_nowait((read, token, time.perf_counter()))

        async def completer() -> None:
            nonlocal copy_seconds, copy_free_at, staged
            for _ in range(len(reads)):
                read, token, submitted = await copying.get()
                try:
                    await device.wait(read, token)
                finally:
                    cost = device.cost(read)
                    staged -= cost
                    budget.release(cost)
                if token is not None:
                    done = time.perf_counter()
                    # Time the copy engine was busy: copies run one after another.
                    copy_seconds += done - max(submitted, copy_free_at)
                    copy_free_at = done
                allocation = allocations[read.span]
                for tensor in read.tensors:
                    waiting_on[tensor.name] -= 1
                    if waiting_on[tensor.name] == 0:
                        del waiting_on[tensor.name]
                        progress.tensors_done += 1
                        progress.bytes_done += tensor.nbytes
                        emit(tensor.name, allocation.tensor(tensor))

        try:
            workers = min(limits.concurrency, len(reads))
            await _gather([reader() for _ in range(workers)] + [submitter(), completer()])
        finally:
            # Reads that landed but were never submitted or completed still hold
            # staging and budget.
            while not landed.empty():
                read, _ = landed.get_nowait()
                device.release(read)
                budget.release(device.cost(read))
            while not copying.empty():
                read, token, _ = copying.get_nowait()
                try:
                    # A submitted copy may still be reading its slot: let it finish.
                    await device.wait(read, token)
                except Exception:
                    pass
                finally:
                    budget.release(device.cost(read))
    finally:
        await aclose_all(blobs)

    finished = time.perf_counter()
    report = LoadReport(
        url=url,
        device=device.name,
        files=len(headers),
        tensors=len(chosen),
        bytes=progress.bytes_total,
        header_seconds=header_done - started,
        read_seconds=max(0.0, last_read_done - header_done),
        copy_seconds=copy_seconds,
        total_seconds=finished - started,
        peak_staging_bytes=peak_staged,
        settings=limits.as_dict(),
    )
    logger.info("%s", report.summary())
    if report.copy_seconds and report.total_seconds > 1.0 and report.overlap < 0.5:
        logger.warning(
            "%s: reads and copies overlapped only %.0f%%; %s",
            url,
            report.overlap * 100,
            report.advice(),
        )
    return report
