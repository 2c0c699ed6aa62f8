"""The pullers a large file's ranges are dealt among (``Split``), and who lists each
range of a file (``Listing``): the node that pulls it from the origin, and the nodes
that downloaded it whole and offer it too.

A node that gave up a puller it never heard from (hearing.py) dealt that puller's
ranges again, alone: its new owner, in another node's eyes the old one still, never
pulled them, and the node read each from the origin once the owner had not listed it
for ``--swarm-stall`` (32 nodes, one file: 33 ranges read twice, the origin sent 2.09
copies). A node that holds a range whole lists it ``held``; a node that cannot hear
the range's puller follows a holder instead (ranged.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .followed import Followed
from .hearing import Hearing

__all__ = ["Listing", "Split"]

Span = tuple[int, int]


@dataclass(frozen=True)
class Split:
    """The pullers a large file's ranges are dealt among (deal.py), this node among
    them or not, and the nodes followed (by id) for the ranges of the others."""

    key: str
    node: str
    pullers: list[str]
    followed: Mapping[str, Followed]
    gate: asyncio.Semaphore  # this node's requests in flight for its ranges (pulling.py)
    cuts: int = 0  # the ranges a file is cut into (0: one per puller)
    start: Callable[[str], int] = lambda name: 0  # where a file's ranges start (deal.py)

    hearing: Hearing = field(default_factory=Hearing)  # the unheard pullers (hearing.py)

    def gone(self) -> set[str]:
        """The nodes gone, and the pullers this node never heard from once it stopped
        asking for them (the split is agreed, the answers each node got are not): their
        ranges are dealt again. While they are asked for, their ranges wait."""
        went = {n for n, f in self.followed.items() if f.gone is not None}
        unheard = {n for n in self.pullers if n != self.node and n not in self.followed}
        return went | self.hearing.gone(unheard)

    def listing(self, name: str, size: int) -> Listing:
        """The ranges of the file ``name`` (this version's ``size``) the nodes alive list."""
        pulled: dict[Span, str] = {}
        held: dict[Span, list[str]] = {}
        gone = self.gone()
        for node, follow in sorted(self.followed.items()):
            offer = follow.manifest.file(name) if follow.manifest else None
            if node in gone or offer is None or offer.size != size:
                continue
            for one in offer.ranges:
                span = (one.offset, one.length)
                if one.held:
                    held.setdefault(span, []).append(node)
                else:
                    pulled.setdefault(span, node)
        return Listing(pulled, held)


@dataclass(frozen=True)
class Listing:
    """Per range ``(offset, length)``: the first node in node order that lists it as its
    puller (``pulled``), and the nodes that list it held, whole, in node order."""

    pulled: dict[Span, str]
    held: dict[Span, list[str]]

    def spans(self) -> set[Span]:
        return set(self.pulled) | set(self.held)

    def holder(self, span: Span, index: int, dealt: str) -> str | None:
        """A node that holds ``span`` whole: ``dealt`` (the deal's owner) where it does,
        else one of the holders, the ``index``-th in turn (the ranges of one puller
        given up spread over the holders); None where nobody lists it held."""
        holders = self.held.get(span, [])
        if not holders:
            return None
        return dealt if dealt in holders else holders[index % len(holders)]
