"""One try of a swarm fetch: whom it follows for each file (``Plan``), and the watch
on the followed nodes (``watched``). The coordinator (coordinator.py) makes a plan
from the peers' answers; the fetch's ``SwarmSource`` asks it file by file."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from .download import SwarmError
from .follower import Follower
from .rendezvous import ranked
from .source import SwarmSource

__all__ = ["LEAD_CHUNK", "Plan", "share_of", "watched"]

LEAD_CHUNK = 8 << 20  # the largest origin read of a node that pulls files (``leading``)


async def watched(work: Awaitable[Any], follows: list[Follower]) -> Any:
    """``work``'s result, while each of ``follows``' nodes is watched
    (``Follower.watch``): one gone fails what waits on it (``Follower.went``), and only
    that; the fetch's other files go on, its own origin reads included."""
    task = asyncio.ensure_future(work)
    watches: dict[asyncio.Future[Any], Follower] = {
        asyncio.ensure_future(f.watch()): f for f in follows
    }
    try:
        pending: set[asyncio.Future[Any]] = {task, *watches}
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for watch in done - {task}:
                error = None if watch.cancelled() else watch.exception()
                if isinstance(error, SwarmError):
                    watches[watch].went(error)
                elif error is not None:
                    raise error
            if task in done:
                return task.result()
    finally:
        for left in (*watches, task):
            left.cancel()
        await asyncio.wait([*watches, task])
        for watch in watches:
            if not watch.cancelled():
                watch.exception()  # handed to its follower, or nobody needs it


class Plan:
    """Whom one try of a fetch follows for each file (``route``: None for the origin).

    Args:
        key: the model's key.
        node: this node's id.
        cohort: the nodes that split the model's files (this one included).
        followers: node id -> its ``Follower``, for every other node of the cohort.
        whole: the node followed for every file, where one holds the model.
        listed: file name -> a node whose manifest lists it (followed for it).
    """

    def __init__(
        self,
        key: str,
        node: str,
        cohort: list[str],
        followers: dict[str, Follower],
        whole: Follower | None = None,
        listed: dict[str, str] | None = None,
    ) -> None:
        self.key, self.node, self.cohort = key, node, cohort
        self.followers, self.whole = followers, whole
        self.listed = listed or {}
        self._assigned: dict[str, str] = {}
        self._routed: set[str] = set()

    def __repr__(self) -> str:
        if self.whole is not None:
            return f"following {self.whole!r}"
        if len(self.cohort) == 1:
            return "pulling from the origin"
        return f"splitting the files among {len(self.cohort)} nodes"

    def leader(self, name: str) -> str:
        """The node that pulls the file ``name`` from the origin (or holds it already)."""
        listed = self.listed.get(name)
        if listed is not None and listed in self.followers:
            return listed
        assigned = self._assigned.get(name)
        return assigned if assigned is not None else ranked(self._key(name), self.cohort)[0]

    def _key(self, name: str) -> str:
        return f"{self.key}/{name}"

    def __call__(self, name: str) -> Follower | None:
        """The node followed for the file ``name``; None: this node pulls it."""
        if self.whole is not None:
            return self.whole
        self._routed.add(name)
        first = self.leader(name)
        return None if first == self.node else self.followers[first]

    def expect(self, names: list[str]) -> None:
        """Deal the files of the fetch out evenly, each to the first node of its own
        ranking that has no more files than any other so far (in name order; every node
        deals alike). Rendezvous hashing alone gave one node of eight four of eight
        shards: its link to the origin, then its upload, set the cluster's pace. A file
        already routed (the index, read to find the others) keeps its node."""
        load = dict.fromkeys(self.cohort, 0)
        for name in sorted(set(names) - self._routed):
            least = min(load.values())
            node = next(n for n in ranked(self._key(name), self.cohort) if load[n] == least)
            self._assigned[name] = node
            load[node] += 1

    def options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The fetch's options: a node that pulls from the origin reads in smaller ranges."""
        return kwargs if self.whole is not None else leading(kwargs)

    def culprit(self, exc: BaseException, made: list[SwarmSource]) -> str | None:
        """The followed node to drop for ``exc``; None: none is to blame (raise it)."""
        if self.whole is not None:
            return self.whole.node
        for source in made:
            if source.blamed is not None:
                return source.blamed
        return None


def share_of(node: str, nodes: list[str], followed: str) -> tuple[int, int]:
    """Which share of each of ``followed``'s files this node asks for first, of how many:
    the followers of that node, in node order (each node sees about the same ones, and
    the shares need not tile exactly)."""
    followers = sorted(set(nodes) - {followed} | {node})
    return followers.index(node), len(followers)


def leading(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A leader's fetch: it reads the origin in ranges of ``LEAD_CHUNK`` bytes at most, so
    that its reads in flight span fewer files, and its first files commit, and reach the
    followers, sooner (16 reads of 16 MiB spanned two 128 MiB shards)."""
    if "options" in kwargs or "limits" in kwargs:
        return kwargs
    from ..settings.options import LoadOptions

    chunk = LoadOptions.build(chunk_size=kwargs.get("chunk_size")).limits
    assert chunk is not None
    return {**kwargs, "chunk_size": min(int(chunk.chunk_size), LEAD_CHUNK)}
