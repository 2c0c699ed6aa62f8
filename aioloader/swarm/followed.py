"""The node a fetch follows (``Followed``; coordinator.py): what it answered, and its
manifest, polled while this node waits for a file or a torrent. A node that stops
offering the model, or whose manifest does not change for the stall time, is a
``SwarmError``: the fetch drops it and turns elsewhere. A node pulling from the origin
shows the bytes it has read in its manifest, so it moves; saying ``fetching`` alone is
no progress (a peer could say it for ever). ``watched`` runs a fetch while its followed
nodes are watched."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from ..redact import redacting_logger
from .asking import Answer
from .download import SwarmError, SwarmStalled
from .manifest import MAX_TORRENT, FileOffer, ManifestError, torrent_name
from .range_torrents import describe_range
from .ranges import RangeOffer
from .torrents import info_hash

FetchRange = Callable[[str, str, Callable[[bytes], bytes]], Awaitable[bytes | None]]

__all__ = ["HOLD", "Answer", "Followed", "Polls", "known_torrent", "watched"]

T = TypeVar("T")
F = TypeVar("F")

_POLL = 0.25  # seconds between looks at a followed node's manifest, at the most often
POLLS_PER_SECOND = 16.0  # asks a node sends to the nodes it follows, all together
HOLD = 10.0  # seconds a followed node may hold an ask while its manifest is unchanged

logger = redacting_logger(__name__)


class Polls:
    """How often a node asks each node it follows: every ``_POLL`` seconds, or less often
    once it follows more than ``per_second * _POLL`` nodes, so that it sends at most
    ``per_second`` asks a second in all, each followed node asked in turn. Before, each
    followed node was asked every 0.25 s while a fetch waited on it and every 0.5 s
    besides: at 32 nodes each node sent and answered about 190 asks a second, and the
    fleet's two vCPUs went to asking, not to moving bytes (3.3x the model from the
    origin, every node at 4x its link's time)."""

    def __init__(self, per_second: float = POLLS_PER_SECOND) -> None:
        self.per_second = per_second
        self.watched = 0  # followed nodes watched now (``Followed.watch``)

    def __repr__(self) -> str:
        return f"<Polls {self.watched} nodes every {self.interval():.2f} s>"

    def interval(self) -> float:
        return max(_POLL, self.watched / self.per_second)


class Followed:
    """The node a fetch follows: its manifest, polled while this node waits for it."""

    def __init__(
        self,
        answer: Answer,
        key: str,
        ask: Callable[..., Awaitable[Answer | None]],  # (api, key[, hold])
        stall: float,
        gone: float | None = None,
        fetch_torrent: Callable[[str, FileOffer], Awaitable[bytes | None]] | None = None,
        late: Callable[[str], bool] = lambda api: False,
        polls: Polls | None = None,
        hold: float = 0.0,
    ) -> None:
        self._ask = ask  # the coordinator's: a peer's answer about a model
        self._fetch_torrent = fetch_torrent  # a torrent by its info hash, checked
        self.torrents: dict[str, bytes] = {}  # file name -> the torrent fetched
        # a range torrent by its info hash, passed through a check (coordinator.py)
        self.fetch_range: FetchRange | None = None
        self._stall = stall
        self._gone = stall if gone is None else min(gone, stall)
        self._late = late  # whether the node's last ask timed out (asking.py)
        self._polls = Polls() if polls is None else polls  # shared by a node's fetches
        # Seconds the node may hold an ask while its manifest stays: the stall time at
        # most, so that a node standing still is seen to within that.
        self._hold = min(hold, stall)
        self.api = answer.api
        self.node = answer.node
        self.key = key
        self.manifest = answer.manifest
        self.others: list[str] = []  # other nodes' swarm addresses, to trade pieces with
        self.share: tuple[int, int] | None = None  # (i, n): the pieces asked for first
        self.gone: SwarmError | None = None  # set by ``watch``: it went away
        self._went = asyncio.Event()
        self._asking = asyncio.Lock()
        self._asked = float("-inf")  # when the manifest was last asked for (loop time)
        self._moved = asyncio.get_running_loop().time()  # when it last changed
        self._heard = self._moved  # when it last answered as itself

    def __repr__(self) -> str:
        return f"<Follow {self.node[:8]} at {self.api}>"

    def swarm_peers(self) -> list[tuple[str, int]]:
        found = []
        for text in ([self.manifest.swarm] if self.manifest else []) + self.others:
            host, _, port = text.rpartition(":")
            found.append((host.strip("[]"), int(port)))
        return found

    async def _wait(self, ready: Callable[[], F | None], what: str) -> F:
        """Poll the manifest until ``ready()`` gives something; SwarmStalled when the
        node's manifest did not change for the stall time. Waiters share the polls."""
        while True:
            found = ready()
            if found is not None:
                return found
            if self.gone is not None:
                raise self.gone
            # Still for the stall time by its own answers: a first answer slow to come
            # (a busy node) is no stall. A node that does not answer is ``watch``'s to
            # give up; past twice the stall time, a wait does without.
            now = asyncio.get_running_loop().time()
            if self._heard - self._moved > self._stall or now - self._heard > 2 * self._stall:
                raise SwarmStalled(f"{self!r}: no {what} for {self._stall:g} s")
            await asyncio.sleep(_POLL)
            await self._look()

    async def _look(self) -> None:
        """Ask the node for its manifest, unless a waiter or the watch did within the
        poll interval (``Polls``)."""
        loop = asyncio.get_running_loop()
        async with self._asking:
            if loop.time() - self._asked < self._polls.interval():
                return
            if self._hold > 0:  # answered when the manifest changes (changes.py)
                answer = await self._ask(self.api, self.key, self._hold)
            else:
                answer = await self._ask(self.api, self.key)
            self._asked = loop.time()
        if answer is None or answer.node != self.node:
            return
        self._heard = loop.time()
        if answer.manifest is None:
            raise SwarmError(f"{self!r} no longer offers the model")
        if answer.manifest != self.manifest:
            # A node pulling from the origin moves: its manifest shows the bytes it has
            # read. Saying "fetching" alone is no progress (a peer could say it for ever).
            self._moved = loop.time()
        self.manifest = answer.manifest

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """``work``'s result, or the ``SwarmError`` of the node gone meanwhile (``work``
        is cancelled then)."""
        if self.gone is not None:
            if asyncio.iscoroutine(work):
                work.close()
            raise self.gone
        task = asyncio.ensure_future(work)
        went = asyncio.ensure_future(self._went.wait())
        try:
            await asyncio.wait({task, went}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            went.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait([task])
        if task.cancelled() and self.gone is not None:
            raise self.gone
        return task.result()

    def went(self, error: SwarmError) -> None:
        """The node went away (``watch``): what waits on it raises ``error`` now."""
        if self.gone is None:
            self.gone = error
            self._went.set()

    async def watch(self) -> None:
        """Look at the node (``_look``: the asks are shared with what waits on it, and
        paced by ``Polls``) while a fetch follows it; SwarmError once it no longer offers
        the model, or has not answered (refused, another daemon at its address) for the
        ``gone`` time: a follower stops waiting on a dead node's pieces then, not after
        the stall time. A node whose asks time out (its port takes the connection, its
        answer comes late: a busy daemon, 32 of them on two vCPUs) is given the stall
        time: taken for dead, it had every node that followed it deal its ranges again,
        85 times in one cold start."""
        loop = asyncio.get_running_loop()
        self._polls.watched += 1
        try:
            while True:
                await asyncio.sleep(self._polls.interval())
                await self._look()
                late = self._late(self.api)
                # Three asks at least: a node asked less often is not dropped sooner. (A
                # held ask's answer has just come when this is looked at.)
                bound = max(self._stall if late else self._gone, 3 * self._polls.interval())
                if loop.time() - self._heard > bound:
                    why = "answered late or not at all" if late else "not answered"
                    raise SwarmError(f"{self!r} has {why} for {bound:g} s")
        finally:
            self._polls.watched -= 1

    async def _while_late(
        self, fetch: Callable[[], Awaitable[bytes | None]], what: str
    ) -> bytes | None:
        """``fetch()``'s torrent, asked again while the node's answers time out (it took
        the connection and answers late: a busy daemon) for the stall time at most, then
        ``TorrentLate`` (``what`` names the torrent); None once it answers without one (or
        with one refused) or refuses. One
        late answer dropped the node before, with every file it served: 82 drops in one
        cold start of 32 nodes, and each dealt the model again; and so did one dropped
        connection (asking.py counts it late now): 76 drops in one cold start of a
        one-file model on 32 nodes, 30.6 copies of it from the origin."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            raw = await fetch()
            if raw is not None or not self._late(self.api) or self.gone is not None:
                return raw
            if loop.time() - start > self._stall:
                raise TorrentLate(
                    f"{self!r}: its torrent of the {what} was not answered for "
                    f"{self._stall:g} s (a busy daemon: it takes the connection, answers late)"
                )
            await asyncio.sleep(self._polls.interval())

    async def offer(self, name: str) -> FileOffer:
        def ready() -> FileOffer | None:
            return self.manifest.file(name) if self.manifest else None

        return await self._wait(ready, f"file {name}")

    async def torrent(self, name: str) -> bytes:
        """The torrent of the file ``name``, once the node lists it, fetched by its info
        hash and checked; SwarmError when the node cannot give it."""

        def ready() -> FileOffer | None:
            offer = self.manifest.file(name) if self.manifest else None
            return offer if offer is not None and offer.info_hash is not None else None

        offer = await self._wait(ready, f"torrent of {name}")
        raw = self.torrents.get(name)
        if raw is None and self._fetch_torrent is not None:
            fetch = self._fetch_torrent
            raw = await self._while_late(lambda: fetch(self.api, offer), f"file {name}")
        if raw is None:
            raise SwarmError(f"{self!r}: its torrent of {name} could not be had")
        self.torrents[name] = raw
        return raw

    async def range_torrent(
        self, name: str, offset: int, length: int, size: int, strict: bool = False
    ) -> bytes:
        """The range torrent of bytes ``[offset, offset + length)`` of the file ``name``
        (``size`` bytes), once the node lists it written, fetched by its info hash (its
        info dict) and checked against that range; SwarmError when it cannot be had.
        ``strict``: NotListed once the node lists ranges of the file but not this one
        (it dealt the file otherwise: it saw other pullers); NotListed too when its
        manifest stays the same for the stall time without the range: a node that
        answers is not dropped (with every range it serves) for one it does not pull."""

        def ready() -> RangeOffer | None:
            offer = self.manifest.file(name) if self.manifest else None
            ranges = offer.ranges if offer is not None and offer.size == size else ()
            for one in ranges:
                if (one.offset, one.length) == (offset, length):
                    if one.info_hash:
                        return one
                    break
            else:
                if strict and ranges:
                    raise NotListed(f"{self!r} does not pull [{offset}, {offset + length})")
            return None

        what = f"range [{offset}, {offset + length}) of {name}"
        try:
            listed = await self._wait(ready, what)
        except SwarmStalled as exc:  # alive, answering, and not pulling it: it dealt the
            raise NotListed(str(exc)) from None  # file otherwise (it saw others gone)
        assert listed.info_hash is not None
        raw = None
        if self.fetch_range is not None:
            check = partial(check_range_torrent, name, size, offset, length, listed.info_hash)
            fetch_range, digest = self.fetch_range, listed.info_hash
            raw = await self._while_late(lambda: fetch_range(self.api, digest, check), what)
        if raw is None:
            raise SwarmError(f"{self!r}: its torrent of the {what} could not be had")
        return raw


class TorrentLate(SwarmError):
    """A followed node alive, answering its model's asks, whose answers to a torrent ask
    stayed late for the stall time: too busy to be followed for that, not gone."""


class NotListed(LookupError):
    """A followed node lists ranges of a file, but not the one asked for."""


def check_range_torrent(
    name: str, size: int, offset: int, length: int, digest: str, raw: bytes
) -> bytes:
    """``raw``, a peer's range torrent, checked (blocking: it parses): the info hash
    listed, and the file's name and size, the range's offset and length offered.

    Raises:
        ManifestError: it is not that torrent, saying how.
    """
    what = f"the torrent of range [{offset}, {offset + length}) of {name}"
    if len(raw) > MAX_TORRENT:
        raise ManifestError(f"{what} is over {MAX_TORRENT} bytes")
    try:
        got = describe_range(raw)[:4]
        actual = info_hash(raw)
    except ValueError as exc:
        raise ManifestError(f"{what} is not a usable range torrent: {exc}") from None
    if actual != digest:
        raise ManifestError(f"{what} has the info hash {actual[:16]}, not {digest}")
    want = (torrent_name(name), size, offset, length)
    if got != want:
        raise ManifestError(
            f"{what} describes {got[0]!r:.80} of {got[1]} bytes, range [{got[2]}, "
            f"{got[2] + got[3]}), not that range of {size} bytes"
        )
    return raw


def known_torrent(follow: Followed | None, name: str, size: int, etag: str | None) -> bytes | None:
    """The followed node's torrent of file ``name`` when it describes the same version
    (size and a strong ETag): the bytes the cache holds are then the torrent's, whether
    they came from the swarm (checked piece by piece) or from the origin."""
    offer = follow.manifest.file(name) if follow is not None and follow.manifest else None
    torrent = follow.torrents.get(name) if follow is not None else None
    if offer is None or torrent is None or etag is None:
        return None
    return torrent if (offer.size, offer.etag) == (size, etag) else None


async def watched(work: Awaitable[T], follows: list[Followed]) -> T:
    """``work``'s result, while each of ``follows``' nodes is watched
    (``Followed.watch``): one gone fails what waits on it (``Followed.went``), and only
    that; the fetch's other files go on, its own origin reads included."""
    task = asyncio.ensure_future(work)
    watches: dict[asyncio.Future[None], Followed] = {
        asyncio.ensure_future(f.watch()): f for f in follows
    }
    try:
        pending: set[asyncio.Future[T] | asyncio.Future[None]] = {task, *watches}
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for watch in watches:
                if watch not in done:
                    continue
                error = None if watch.cancelled() else watch.exception()
                if isinstance(error, SwarmError):
                    watches[watch].went(error)
                elif error is not None:
                    raise error
            if task in done:
                return task.result()
    finally:
        left: list[asyncio.Future[T] | asyncio.Future[None]] = [*watches, task]
        for one in left:
            one.cancel()
        await asyncio.wait(left)
        for watch in watches:
            if not watch.cancelled():
                watch.exception()  # handed to its followed node, or nobody needs it
