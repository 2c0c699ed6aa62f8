"""Which byte ranges of a file are present: a sorted set of disjoint intervals (pure).

A cache keeps the ranges of a file it has (cache/), a digest the ranges that arrived
(sources/verifying.py), a cache sink the ranges written through (sinks/)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["RangeSet", "split"]


class RangeSet:
    """Half-open byte ranges ``[start, end)``, merged whenever they touch or overlap."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._ranges: list[tuple[int, int]] = []
        for start, end in ranges:
            self.add(start, end)

    def __repr__(self) -> str:
        return f"RangeSet({self._ranges!r})"

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(list(self._ranges))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and self._ranges == other._ranges

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        """Whether any byte is present (without it, an empty set was true)."""
        return bool(self._ranges)

    @property
    def total(self) -> int:
        """Bytes covered."""
        return sum(end - start for start, end in self._ranges)

    def add(self, start: int, end: int) -> None:
        """Mark ``[start, end)`` present."""
        if end <= start:
            return
        kept: list[tuple[int, int]] = []
        for s, e in self._ranges:
            if e < start or s > end:
                kept.append((s, e))
            else:
                start, end = min(s, start), max(e, end)
        kept.append((start, end))
        kept.sort()
        self._ranges = kept

    def covers(self, start: int, end: int) -> bool:
        """Whether every byte of ``[start, end)`` is present."""
        if end <= start:
            return True
        return any(s <= start and end <= e for s, e in self._ranges)

    def prefix(self) -> int:
        """How many bytes from the start are present without a gap."""
        if self._ranges and self._ranges[0][0] == 0:
            return self._ranges[0][1]
        return 0

    def missing(self, size: int) -> list[tuple[int, int]]:
        """The gaps in ``[0, size)``, in order."""
        gaps = []
        position = 0
        for s, e in self._ranges:
            if s >= size:
                break
            if s > position:
                gaps.append((position, s))
            position = max(position, e)
        if position < size:
            gaps.append((position, size))
        return gaps


def split(ranges: Iterable[tuple[int, int]], piece: int) -> list[tuple[int, int]]:
    """Cut each range into pieces of at most ``piece`` bytes."""
    out = []
    for start, end in ranges:
        for s in range(start, end, piece):
            out.append((s, min(s + piece, end)))
    return out
