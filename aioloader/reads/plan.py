"""Turn validated headers into byte-range reads (pure, no I/O).

The selected tensors of a file form *spans*: runs of neighbouring tensors, widened
to 4 KiB boundaries, each filled into one buffer. Each span is cut into reads of
at most ``read_size`` bytes, also on 4 KiB boundaries: a big tensor becomes many
reads that proceed in parallel, many small neighbours share one read, and every
read can bypass the page cache with ``O_DIRECT``, which needs that alignment.

The reads of a span never overlap, so every byte of a buffer is written exactly
once: a tensor handed to the caller is never written again, not even by a read of
its neighbour that covers the same 4 KiB block.

A tensor cut to some of its rows (rows.py) is a span of its own (``sliced``): its
bytes differ from rank to rank, so it is never merged with neighbours that every
rank shares. Its buffer may then hold a 4 KiB block that a neighbour's span holds
too; each buffer gets its own copy.

A span holds at most ``SPAN_TENSORS`` tensors: a device makes every tensor of a
span at once, and the loader hands out the tensors of a read at once, each without
letting the event loop run: one span of hundreds of thousands of small tensors
would hold the loop for seconds. A span cut there may share its last 4 KiB block
with the next span, which then gets its own copy, as above.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from ..format.safetensors import FileHeader, TensorInfo
from ..runtime.container_memory import MemoryLimit
from ..runtime.direct_io import ALIGNMENT  # the reads' 4 KiB grid is O_DIRECT's
from .room import check_room

__all__ = ["ALIGNMENT", "SPAN_TENSORS", "Read", "Span", "plan_reads"]

#: The most tensors in one span (see the module docstring): a short hold of the loop each.
SPAN_TENSORS = 1024


def _down(n: int) -> int:
    return n - n % ALIGNMENT


def _up(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True, slots=True, eq=False)
class Span:
    """Neighbouring selected tensors of one file, read into one buffer.

    ``start`` is aligned; ``end`` is aligned too and may pass the end of the file
    (bytes past it are never filled). Tensors lie in ``[start, end)``. ``sliced``:
    one tensor cut to some of its rows (see the module docstring).
    """

    file: int
    url: str
    start: int
    end: int
    tensors: tuple[TensorInfo, ...]
    sliced: bool = False

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True, eq=False)
class Read:
    """One aligned byte range of a span, and the tensors whose bytes it holds."""

    span: Span
    start: int
    end: int
    tensors: tuple[TensorInfo, ...]

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def url(self) -> str:
        return self.span.url

    def describe(self) -> str:
        names = [t.name for t in self.tensors]
        shown = ", ".join(repr(n) for n in names[:3])
        if len(names) > 3:
            shown += f" and {len(names) - 3} more"
        return f"{self.url} bytes [{self.start}, {self.end}) (tensor {shown})"


def _spans(
    file: int, url: str, tensors: Sequence[TensorInfo], alone: Collection[str] = ()
) -> list[Span]:
    spans: list[Span] = []
    group: list[TensorInfo] = []
    for tensor in tensors:
        if tensor.nbytes == 0:
            continue
        if tensor.name in alone:
            if group:
                spans.append(
                    Span(file, url, _down(group[0].start), _up(group[-1].end), tuple(group))
                )
                group = []
            spans.append(
                Span(file, url, _down(tensor.start), _up(tensor.end), (tensor,), sliced=True)
            )
            continue
        # A gap too small to leave a whole aligned block unread costs nothing.
        if group and (_down(tensor.start) > _up(group[-1].end) or len(group) >= SPAN_TENSORS):
            spans.append(Span(file, url, _down(group[0].start), _up(group[-1].end), tuple(group)))
            group = []
        group.append(tensor)
    if group:
        spans.append(Span(file, url, _down(group[0].start), _up(group[-1].end), tuple(group)))
    return spans


def _cut(span: Span, read_size: int) -> list[Read]:
    reads = []
    first = 0  # index of the first tensor that may overlap the next read
    tensors = span.tensors
    for start in range(span.start, span.end, read_size):
        end = min(start + read_size, span.end)
        while first < len(tensors) and tensors[first].end <= start:
            first += 1
        last = first
        while last < len(tensors) and tensors[last].start < end:
            last += 1
        reads.append(Read(span, start, end, tensors[first:last]))
    return reads


def plan_reads(
    headers: Sequence[FileHeader],
    selected: Iterable[str] | None,
    read_size: int,
    alone: Collection[str] = (),
    room: MemoryLimit | None = None,
) -> tuple[list[Span], list[Read]]:
    """Plan the spans and reads that fill every selected tensor.

    Args:
        headers: validated headers, one per file, in load order.
        selected: names of tensors to read (``None`` = all).
        read_size: the largest single read; rounded down to 4 KiB (at least 4 KiB).
        alone: names of tensors cut to some of their rows: each gets a ``sliced`` span.
        room: the most memory the selected tensors may take (``Device.room``).

    Returns:
        Spans in file order, and reads in file order, ascending offset within
        each file. Zero-byte tensors need no read and appear in neither.

    Raises:
        OutOfMemoryError: the selected tensors need more than ``room``.
    """
    read_size = max(ALIGNMENT, _down(read_size))
    wanted = None if selected is None else set(selected)
    files = [
        (header.url, [t for t in header.tensors if wanted is None or t.name in wanted])
        for header in headers
    ]
    if room is not None:
        check_room(files, room)  # before a claimed petabyte is cut into reads
    spans: list[Span] = []
    reads: list[Read] = []
    for index, (url, chosen) in enumerate(files):
        for span in _spans(index, url, chosen, alone):
            spans.append(span)
            reads.extend(_cut(span, read_size))
    return spans, reads
