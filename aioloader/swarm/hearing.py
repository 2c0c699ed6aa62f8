"""Pullers of the agreed split this node has not heard from (``Hearing``, ``hear``):
asked again, and counted gone only once the gone time has passed without an answer.

The split is agreed (deal.py): a node may take one that names pullers whose answers it
never had (a busy daemon answers one node in time and not another). Counted gone at
once, their ranges were dealt again by each node in a turn that followed its own set of
the unheard, so the nodes of one cluster named different owners for the same range, and
each read from the origin what its owner did not list (21 to 32 copies of a one-file
model on 32 nodes). Now the ranges of an unheard puller wait while its node is asked
(ranged.py); one that answers is followed like any other, and the pullers still unheard
when the time is up are given up all at once, alike on every node that heard the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from ..redact import redacting_logger
from .asking import Answer
from .download import SwarmError
from .followed import Followed

__all__ = ["Hearing", "hear"]

logger = redacting_logger(__name__)


class Hearing:
    """Whether the unheard pullers of a split are still asked for (``open``); those
    ``given_up`` once the time ran out. Plain state, shared by a try's ranged files."""

    def __init__(self, open: bool = False) -> None:
        self.open = open
        self.given_up: set[str] = set()

    def __repr__(self) -> str:
        state = "asking" if self.open else f"closed, {len(self.given_up)} given up"
        return f"<Hearing {state}>"

    def gone(self, unheard: Iterable[str]) -> set[str]:
        """Of the pullers ``unheard`` (no node followed for them), those counted gone:
        none while they are asked for, all once the asking is over."""
        return set() if self.open else set(unheard)


async def hear(
    hearing: Hearing,
    pullers: Iterable[str],
    heard: Callable[[], set[str]],
    silent: list[str],
    ask: Callable[[str], Awaitable[Answer | None]],
    follow: Callable[[Answer], Followed | None],
    gone: float,
    stall: float,
    late: Callable[[str], bool],
    interval: Callable[[], float],
    why: Callable[[str], str | None] = lambda api: None,
) -> None:
    """Ask the ``silent`` API addresses until every puller is ``heard`` (a node followed
    for it) or none answered for ``gone`` seconds (``stall`` while one of them answers
    late: it takes the connection, a busy daemon); an answer from a puller not heard is
    handed to ``follow`` (it makes the node followed, and None where it is not wanted),
    and the node is watched while the try runs. Then the hearing closes: the pullers
    still unheard are given up (``Hearing.given_up``), and the warning says ``why``
    each address still silent gave no answer (its last ask's failure).

    Runs while the try runs and is cancelled with it; the watches with it."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    wanted = set(pullers)
    watches: list[asyncio.Task[None]] = []
    left = list(silent)
    try:
        while left and wanted - heard():
            bound = stall if any(late(api) for api in left) else gone
            if loop.time() - start > bound:
                break
            answers = await asyncio.gather(*(ask(api) for api in left))
            for api, answer in zip(list(left), answers, strict=True):
                if answer is None:
                    continue
                left.remove(api)
                if answer.node not in wanted or answer.node in heard():
                    continue
                followed = follow(answer)
                if followed is not None:
                    logger.info("%r: heard at last, its ranges followed there", followed)
                    watches.append(loop.create_task(_watch(followed)))
            await asyncio.sleep(interval())
        hearing.given_up = wanted - heard()
        hearing.open = False
        if hearing.given_up:
            silent_now = "; ".join(f"{api}: {why(api) or 'no usable answer'}" for api in left)
            logger.warning(
                "%d pullers of the split never answered (%s); their ranges are dealt again",
                len(hearing.given_up),
                silent_now or "none of the addresses asked",
            )
        await asyncio.gather(*watches)
    finally:
        hearing.open = False
        for task in watches:
            task.cancel()
        for task in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _watch(followed: Followed) -> None:
    """``followed.watch()`` while the try runs: a node gone fails what waits on it."""
    try:
        await followed.watch()
    except SwarmError as exc:
        followed.went(exc)
