"""A large file of a cold split is dealt in byte ranges, not whole (``spans``, ``owner``),
and the ranges a manifest lists (``RangeOffer``, ``parse_ranges``).

Every node computes the same ranges and the same owner for each, from the file's size
(the origin's, asked by every node), the split's pullers (deal.py) and the pullers it
knows are gone: pure functions, no I/O, no clock. A file under ``RANGED_FROM`` stays
whole (one puller, deal.py's file deal); a larger one is cut into piece-aligned ranges
of ``size / cuts`` within a piece (at most ``MAX_RANGE``; ``cuts``, the cluster's nodes as
configured over the model's weight files, deal.py), and the ranges of the model's
files, one file after the other, go round the model's ranking of the pullers
(rendezvous.py): every puller reads about a 1/n of the model from the origin, whatever
the file count. The ranges of a
puller that is gone go to the pullers left, in turn, in the same ranking: every
survivor re-deals alike, and the ranges of the pullers alive keep their owner.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .rendezvous import ranked
from .torrents import MIN_PIECE

__all__ = [
    "MAX_RANGE",
    "MAX_RANGES",
    "RANGED_FROM",
    "RangeOffer",
    "adopted",
    "owner",
    "parse_ranges",
    "spans",
]

RANGED_FROM = 64 << 20
"""A file of at least this many bytes is dealt in ranges; a smaller one stays whole."""
MAX_RANGE = 256 << 20
"""The longest range."""
PIECE = MIN_PIECE
"""The piece of a range torrent (torrents.py's for a large file)."""
MAX_RANGES = 4096
"""Ranges one file of a manifest may list (more is a lie)."""
_HEX = re.compile(r"^[0-9a-f]{64}$")


def spans(size: int, pullers: int, piece: int = PIECE) -> list[tuple[int, int]]:
    """``(offset, length)`` of each range of a file of ``size`` bytes dealt among
    ``pullers``: one range (the whole file) under ``RANGED_FROM``; else the file's
    pieces dealt out evenly, a range per puller (fewer where the file has fewer pieces,
    more where a range would pass ``MAX_RANGE``), the first ones a piece longer than
    the rest, the last one ending at the file's end.

    Each puller's share rounded up to the piece left pullers without a range: a 128 MiB
    file and its header on 32 made 26 ranges of 5 MiB."""
    if size < RANGED_FROM or pullers < 1:
        return [(0, size)]
    pieces = -(-size // piece)
    count = max(min(pullers, pieces), -(-pieces // (MAX_RANGE // piece)))
    base, longer = divmod(pieces, count)
    found, at = [], 0
    for i in range(count):
        end = min(at + (base + (i < longer)) * piece, size)
        found.append((at, end - at))
        at = end
    return found


def owner(
    key: str, name: str, count: int, index: int, pullers: list[str], gone: set[str], start: int = 0
) -> str:
    """The puller of range ``index`` of the ``count`` ranges of file ``name`` of model
    ``key``: the ``(start + index)``-th of the model's ranking of the pullers (in turn;
    ``start``, the ranges of the model's files before this one, so the ranges of all its
    files go round the pullers evenly); where that one is ``gone``, the ranges of the
    gone go to the pullers left, in turn in that ranking. Every node that knows the same
    pullers gone computes the same. All gone: ""."""
    order = ranked(key, pullers)
    first = order[(start + index) % len(order)]
    if first not in gone:
        return first
    left = [n for n in order if n not in gone]
    if not left:
        return ""
    orphans = [i for i in range(count) if order[(start + i) % len(order)] in gone]
    turn = orphans.index(index) + sum(order[i % len(order)] in gone for i in range(start))
    return left[turn % len(left)]


@dataclass(frozen=True)
class RangeOffer:
    """One range of a file in a manifest: its bytes ``[offset, offset + length)``, the
    bytes its puller has read of it (``done``), and its range torrent's info hash once
    written and seeded. ``held``: the node did not pull it, it downloads it from a peer
    (``done`` of it here: 0 until it is whole) and offers it too, its pieces as they
    come (ranged.py: a node that gave up the range's puller finds it there).
    ``torrent`` (the full torrent, seeded here) and ``served`` (what a peer fetches by
    the info hash: range_torrents.py's ``served``) are this node's only."""

    offset: int
    length: int
    done: int = 0
    info_hash: str | None = None
    torrent: bytes | None = field(default=None, compare=False, repr=False)
    served: bytes | None = field(default=None, compare=False, repr=False)
    held: bool = False

    def as_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            "offset": self.offset,
            "length": self.length,
            "done": self.done,
            "info_hash": self.info_hash,
        }
        return found | {"held": True} if self.held else found


def _int(value: object, what: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise ValueError(f"{what} is not an integer from 0 to {top}")
    return value


def parse_ranges(raw: object, size: int, what: str) -> tuple[RangeOffer, ...]:
    """A peer's ranges of a file of ``size`` bytes (``what`` names it), checked: a list
    of at most ``MAX_RANGES`` objects, each inside the file, not empty, done within
    its length, a v2 info hash or null, ``held`` (if there) true or false and only with
    an info hash; no two overlapping.

    Raises:
        ValueError: any of that does not hold, saying which.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_RANGES:
        raise ValueError(f"{what}.ranges is not a list of at most {MAX_RANGES}")
    found = []
    for i, item in enumerate(raw):
        at = f"{what}.ranges[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{at} is not an object")
        offset = _int(item.get("offset"), f"{at}.offset", size)
        length = _int(item.get("length"), f"{at}.length", size - offset)
        if length == 0:
            raise ValueError(f"{at} is empty")
        digest = item.get("info_hash")
        if digest is not None and (not isinstance(digest, str) or not _HEX.match(digest)):
            raise ValueError(f"{at}.info_hash is not a v2 info hash (64 hex digits)")
        done = _int(item.get("done", 0), f"{at}.done", length)
        held = item.get("held", False)
        if not isinstance(held, bool):
            raise ValueError(f"{at}.held is not true or false")
        if held and digest is None:
            raise ValueError(f"{at} is held without its info hash")
        found.append(RangeOffer(offset, length, done, digest, held=held))
    _disjoint(found, what)
    return tuple(found)


def _disjoint(found: Iterable[RangeOffer], what: str) -> None:
    end = 0
    for one in sorted(found, key=lambda r: r.offset):
        if one.offset < end:
            raise ValueError(f"{what}.ranges overlap at byte {one.offset}")
        end = one.offset + one.length


def adopted(listed: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """The ranges of a split under way: those listed (the first of any that overlap),
    and the gaps between them cut as ``spans`` cuts a file."""
    found: list[tuple[int, int]] = []
    at = 0
    for offset, length in [*listed, (size, 0)]:
        if offset < at:
            continue
        while at < offset:
            n = min(MAX_RANGE, offset - at)
            found.append((at, n))
            at += n
        if length:
            found.append((offset, length))
        at = offset + length
    return found
