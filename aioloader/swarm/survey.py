"""Before a node deals a model: what the other nodes say about it (coordinator.py).

The nodes are asked again for ``SETTLE`` times the answer wait at most while nobody
holds the model, no split of it is published (deal.py), and some listed peer is silent
(a cold cluster's daemons start within seconds of each other, and a busy one answers
late) or a node before this one in node order fetches it and is about to publish its
split: one node deals, and the others take its split (each dealing its own cut one
file 32 ways on 32 nodes). Waiting on that node lasts twice as long at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from .asking import Answer
from .deal import published

__all__ = ["SETTLE", "confirmed", "survey"]

T = TypeVar("T")

SETTLE = 5  # times ``wait``: how long silent peers are asked again before ranking


async def survey(
    node: str,
    key: str,
    wait: float,
    peers: Callable[[], Awaitable[list[str]]],
    ask: Callable[[str, str], Awaitable[Answer | None]],
) -> list[Answer]:
    """The answers about ``key`` of the nodes ``peers`` lists, this one (``node``) left out."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        apis = await peers()
        found = await gathered(ask(api, key) for api in apis)
        answers = [a for a in found if a is not None and a.node != node]
        silent = sum(1 for a in found if a is None)
        held = any(a.manifest is not None and a.manifest.state == "complete" for a in answers)
        if held or published(answers):
            return answers
        dealer = any(
            a.node < node and a.manifest is not None and a.manifest.state == "fetching"
            for a in answers
        )
        waited = (loop.time() - start) / wait
        if not ((silent and waited < SETTLE) or (dealer and waited < 2 * SETTLE)):
            return answers
        await asyncio.sleep(min(wait, 0.25) if dealer else wait)


async def confirmed(
    node: str,
    key: str,
    wait: float,
    own: tuple[str, ...],
    answers: list[Answer],
    peers: Callable[[], Awaitable[list[str]]],
    ask: Callable[[str, str], Awaitable[Answer | None]],
) -> tuple[list[Answer], tuple[str, ...]]:
    """The split a node that dealt its own (``own``, published already: no other was)
    takes, ``wait`` seconds on, once every peer is asked again: its own, or another
    published meanwhile that comes first (deal.published); and the answers, the new in
    place of the old. Nodes that dealt at once each kept their own split before (9 of
    32, each by the 24 to 31 nodes it had heard): the owners of one file's ranges
    differed from node to node, and each read from the origin what no owner listed."""
    await asyncio.sleep(wait)
    found = await gathered(ask(api, key) for api in await peers())
    fresh = {a.node: a for a in found if a is not None and a.node != node}
    merged = [fresh.pop(a.node, a) for a in answers] + list(fresh.values())
    return merged, published(merged, own)


async def gathered(coros: Iterable[Awaitable[T]]) -> list[T]:
    """The results of ``coros``, run at once, in the order they finish."""
    from ..runtime.tasks import gather

    results: list[T] = []

    async def one(coro: Awaitable[T]) -> None:
        results.append(await coro)

    await gather(one(c) for c in coros)
    return results
