"""One try's routes as a fetch's supply asks them (``Routes``, supply.py's ``Route``):
the node followed for a file, the split a large file's ranges are dealt among, and the
pullers of that split not heard yet (hearing.py)."""

from __future__ import annotations

import asyncio

from .deal import Deal
from .followed import Followed
from .hearing import Hearing
from .manifest import MAX_ORIGIN_REQUESTS
from .splits import Split

__all__ = ["Routes"]


class Routes:
    """A deal's routes: ``followed``, node id -> the node followed (one heard after the
    deal is added, hearing.py); ``gate``, this node's requests in flight for its ranges."""

    def __init__(self, deal: Deal, followed: dict[str, Followed]) -> None:
        self.deal, self.followed = deal, followed
        self.hearing = Hearing()
        self.gate = asyncio.Semaphore(deal.share or MAX_ORIGIN_REQUESTS)  # ranged.py

    def __repr__(self) -> str:
        return str(self.deal)

    def __call__(self, name: str) -> Followed | None:
        node = self.deal.route(name)
        return None if node is None else self.followed[node]

    def expect(self, names: list[str]) -> None:
        self.deal.expect(names)

    def ranged(self) -> Split | None:
        deal = self.deal
        pullers = deal.ranged()
        if pullers is None:
            return None
        return Split(
            deal.key, deal.node, pullers, self.followed, self.gate, deal.cuts(), deal.start,
            self.hearing,
        )  # fmt: skip
