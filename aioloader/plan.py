"""Turn validated headers into byte-range reads (pure, no I/O).

The selected tensors of a file form runs of contiguous bytes. Each run is cut
into reads of at most ``read_size`` bytes: a big tensor becomes many reads that
proceed in parallel, and many small neighbours share one read, scattered
straight into their own buffers (``preadv`` / one HTTP range).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .safetensors import FileHeader, TensorInfo

__all__ = ["Piece", "Read", "plan_reads"]

# Linux caps an iovec array at 1024 entries (IOV_MAX); stay well below.
MAX_PIECES = 512


@dataclass(frozen=True, slots=True)
class Piece:
    """The part of one tensor that a read fills: absolute file bytes [start, end)."""

    tensor: TensorInfo
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Read:
    """One contiguous byte range of one file, and the tensor pieces it fills."""

    file: int
    url: str
    start: int
    end: int
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        names = [p.tensor.name for p in self.pieces]
        shown = ", ".join(repr(n) for n in names[:3])
        if len(names) > 3:
            shown += f" and {len(names) - 3} more"
        return f"{self.url} bytes [{self.start}, {self.end}) (tensor {shown})"


def _runs(tensors: Sequence[TensorInfo]) -> Iterator[list[TensorInfo]]:
    """Group tensors (sorted by offset) into runs of back-to-back byte ranges."""
    run: list[TensorInfo] = []
    for tensor in tensors:
        if tensor.nbytes == 0:
            continue
        if run and tensor.start != run[-1].end:
            yield run
            run = []
        run.append(tensor)
    if run:
        yield run


def _cut(file: int, url: str, run: list[TensorInfo], read_size: int) -> Iterator[Read]:
    index = 0  # first tensor that may still overlap the next read
    position = run[0].start
    end_of_run = run[-1].end
    while position < end_of_run:
        limit = min(position + read_size, end_of_run)
        pieces: list[Piece] = []
        i = index
        while i < len(run) and run[i].start < limit and len(pieces) < MAX_PIECES:
            tensor = run[i]
            piece_end = min(tensor.end, limit)
            pieces.append(Piece(tensor, max(tensor.start, position), piece_end))
            if piece_end < tensor.end:
                break
            i += 1
        end = pieces[-1].end
        yield Read(file, url, position, end, tuple(pieces))
        index = i
        position = end


def plan_reads(
    headers: Sequence[FileHeader],
    selected: Iterable[str] | None,
    read_size: int,
) -> list[Read]:
    """Plan the reads that fill every selected tensor exactly once.

    Args:
        headers: validated headers, one per file, in load order.
        selected: names of tensors to read (``None`` = all).
        read_size: the largest single read in bytes.

    Returns:
        Reads in file order, ascending offset within each file; zero-byte tensors
        need no read and do not appear.
    """
    if read_size <= 0:
        raise ValueError("read_size must be positive")
    wanted = None if selected is None else set(selected)
    reads: list[Read] = []
    for index, header in enumerate(headers):
        tensors = [t for t in header.tensors if wanted is None or t.name in wanted]
        for run in _runs(tensors):
            reads.extend(_cut(index, header.url, run, read_size))
    return reads
