"""Per model, and per file of it, whom a daemon follows, or whether it pulls from the
origin itself.

``Coordinator.fetch(url)``:

1. ask every peer ``GET /v1/swarm/models/{key}`` at once, within ``wait`` seconds;
   while nobody holds the model or pulls it and some listed peers have not answered,
   ask again for up to ``SETTLE`` times ``wait`` (survey.py) (a cold cluster's daemons start
   within seconds of each other: one not listening yet must not be ranked out; a
   peer that never comes costs that much, once);
2. a peer that holds the model whole is followed for every file (``Deal.whole``);
3. nobody holds it (a cold cluster): the nodes that answered, but those following a
   holder, and this one split the model: a file under 64 MiB is pulled from the
   origin by the first node of its own ranking (rendezvous.py), a larger one in byte
   ranges, about one per puller (ranges.py, ranged.py), each published as soon as it
   is written; every other node follows each file's or range's puller. Every node's
   link to the origin works at once, and each byte leaves the origin once. A node in
   the split says ``fetching``; one following a holder says ``following``;
4. a followed node stalls, goes away or sends bytes the cache refuses: it is dropped
   and the rest ranked again, which may make this node the one to pull its files from
   the origin (files already in the cache are not fetched again).

Before it follows anyone for a file, a node asks the origin for the file's current
version (swarm/supply.py): a file its cache holds at that version is offered at once
(a warm fleet restarted all at once gets ready without waiting for each other), and a
followed node's copy of another version is never taken. After a fetch, this node
offers every file of the model (seeded from its cache entries) and its manifest says
``complete``. Two fetches of one model on one node take turns: the second finds the
first's files in the cache.

The fetch itself is the node cache's (``ModelCache.fetch``); the swarm takes part
through its one seam, a ``Supply`` (supply.py). A followed node is blamed, and dropped,
only for what it did (a stall, going away, a copy refused); a failure of this node's
own (its disk full, its cache not writable) or of the origin is raised as it is.

Peers prove they hold the cluster's token both ways without sending it (proof.py,
asking.py); the swarm's IP filter follows the proven peers (admission.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache.entry import Version
from ..errors import LoaderError
from ..redact import redacting_logger
from ..runtime.threads import Lane, run_blocking
from ..settings.options import LoadOptions
from ..sources.base import Current
from .admission import Admission
from .asking import Asker
from .deal import Lead, deal, published
from .followed import HOLD, Answer, Followed, Polls, known_torrent, watched
from .gentle import Heard, leading
from .hearing import hear
from .looking import cluster_view, own_view
from .manifest import FileOffer, Manifest, State, file_name, model_key
from .offers import Offers
from .peers import PeerAddress
from .proof import PeerProof
from .routes import Routes
from .session import Swarm, SwarmError
from .supply import Reads, SwarmSupply
from .survey import confirmed, survey
from .view import ClusterView, NodeView, parse_one

if TYPE_CHECKING:
    import aiohttp

    from ..cache.fetch import Progress
    from ..cache.model_cache import ModelCache
    from ..cache.records import CachedModel
    from ..sources.stores import Location

__all__ = ["Coordinator"]

logger = redacting_logger(__name__)

HELD_CHECK = 5.0  # seconds between looks at the seeded files, for other processes' removals


class Coordinator(Offers):
    """The daemon's side of the swarm: manifests of its models, fetches through peers.

    Args:
        swarm: the started session.
        peers: the configured peers' API addresses.
        node: this daemon's id.
        token: the token all daemons share (None: none).
        wait: seconds to wait for the peers' answers.
        scratch: where swarm downloads land before the cache copies them.
        advertised: this node's swarm address as peers reach it (``ip:port``).
        origin_requests: the cluster's cap on requests in flight to an origin, shared
            out among the nodes that pull from it (None: no cap; the lowest a node of
            the split is configured with holds, see deal.py).
    """

    def __init__(
        self,
        swarm: Swarm,
        peers: list[PeerAddress],
        node: str,
        token: str | None,
        wait: float,
        scratch: Path,
        advertised: str,
        origin_requests: int | None = None,
    ) -> None:
        super().__init__(swarm, node, advertised)
        self.origin_requests = origin_requests
        self.heard = Heard()  # the peers' throttling answers, heeded
        self.peers = peers
        self.wait = wait
        self.scratch = scratch
        self.reads: dict[str, Reads] = {}
        self.supplies: dict[str, SwarmSupply] = {}  # model key -> its running try's
        self._views = Lane("views", 1)  # peers' views decoded, never behind a torrent made
        self.proof = PeerProof(token)
        self.admission = Admission(swarm, peers, self.proof.enabled)
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # a model's fetches, in turn
        self._watch: asyncio.Task[None] | None = None
        self._client: aiohttp.ClientSession | None = None
        self._asker: Asker | None = None
        self._polls = Polls()  # how often the nodes this one follows are asked
        self._apis: list[str] = []

    def __repr__(self) -> str:
        return f"<Coordinator node={self.node[:8]} peers={len(self.peers)}>"

    async def __aenter__(self) -> Coordinator:
        import aiohttp

        # No token in any header: a peer is sent a proof instead (proof.py).
        self._client = aiohttp.ClientSession()
        self._asker = Asker(
            self._client, self.proof, self.node, self.advertised, self.wait, self._lane
        )
        self._watch = asyncio.get_running_loop().create_task(
            self._watching(), name="aioloader swarm held files"
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.manifests.release()  # no ask is held any more
        try:
            if self._watch is not None:
                self._watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._watch
            if self._client is not None:
                await self._client.close()
        finally:
            self.close()
            self._views.close()
            self.admission.close()

    def set_peers(self, peers: list[PeerAddress]) -> None:
        """The peers' API addresses, in place of those given at the start (a daemon
        embedded in a program that learns them later: aioloader/ray/preload.py); the next fetch
        resolves and asks them, and the swarm's filter follows."""
        self.peers = list(peers)
        self.admission.peers = self.peers

    # -- files that leave the cache while seeded, and the peers' addresses ---------------

    async def _watching(self) -> None:
        while True:
            await asyncio.sleep(HELD_CHECK)
            try:
                await self.check_held()
                await self.admission.refresh()  # an idle holder's filter follows too
            except (OSError, LoaderError, SwarmError) as exc:  # say so, go on
                logger.warning("checking the seeded files or the peers failed: %s", exc)

    async def _peers(self) -> list[str]:
        """Every peer API address, resolved now; the swarm's filter follows."""
        self._apis = await self.admission.resolve()
        return self._apis

    async def ask(self, api: str, key: str, hold: float = 0.0) -> Answer | None:
        """A peer's answer about the model ``key`` (None: no usable answer, or no proof
        that it holds the token; ``hold``: see Asker.ask); a proven peer's swarm address
        is admitted."""
        assert self._asker is not None, "used outside its async with"
        answer = await self._asker.ask(api, key, hold)
        if answer is not None:
            await self.admission.learn([answer.swarm])
            if answer.manifest is not None:
                self.heard.heed(answer.node, answer.manifest.throttled)
        return answer

    async def _torrent(self, api: str, offer: FileOffer) -> bytes | None:
        """The torrent of a peer's ``offer``, fetched by its info hash and checked."""
        assert self._asker is not None, "used outside its async with"
        return await self._asker.torrent(api, offer)

    async def admit(self, swarm: str, remote: str | None) -> None:
        """A peer that proved it holds the token asked from ``remote``, its swarm at
        ``swarm``: both are let through the swarm's filter (answering.py)."""
        await self.admission.learn([swarm, remote])

    # -- the cluster's view (looking.py) ---------------------------------------------------

    def view(self, api: str | None) -> NodeView:
        """This node's view of its models; ``api``: its API address as asked."""
        ways = {key: supply.ways() for key, supply in self.supplies.items()}
        return own_view(
            self.node, api, self.advertised, self.swarm, self.manifests, self.reads, ways
        )

    async def cluster(self, own: NodeView, wait: float) -> ClusterView:
        """``own`` and every peer's view, each asked within ``wait`` seconds."""
        asker = self._asker
        assert asker is not None, "used outside its async with"

        async def ask(api: str) -> NodeView:
            raw = await asker.view(api, wait)
            return await run_blocking(self._views, lambda: parse_one(raw, f"peer {api}"))

        return await cluster_view(own, await self._peers(), ask, wait)

    # -- one try of a fetch ----------------------------------------------------------------

    def _supply(self, key: str, reads: Reads, route: Routes, cache: ModelCache) -> SwarmSupply:
        """A try's supply: its files from the nodes ``route`` follows, the cache, or the
        origin; each committed file offered to the peers."""

        async def held(url: str, current: Current) -> Path | None:
            return await self._held_here(key, cache, url, current)

        async def publish(url: str, data: Path, version: Version) -> None:
            name = file_name(url)
            known = known_torrent(route(name), name, version.size, version.etag)
            await self._publish(
                key, url, data, version.size, version.etag, version.last_modified, known
            )

        return SwarmSupply(self.swarm, self.scratch, reads, route, self._note(key), held, publish)

    # -- a fetch --------------------------------------------------------------------------

    async def fetch(
        self,
        where: Location,
        cache: ModelCache,
        options: LoadOptions,
        progress: Progress | None = None,
    ) -> CachedModel:
        """``cache.fetch(where, options=options, progress=progress)`` through the swarm
        (``where``: the model's URL as the daemon parsed and judged it); returns its
        CachedModel. Fetches of one model take turns."""
        key = model_key(where.first)
        lock, users = self._turns.get(key, (asyncio.Lock(), 0))
        self._turns[key] = (lock, users + 1)
        try:
            async with lock:
                return await self._fetch_alone(key, where, cache, options, progress)
        finally:
            lock, users = self._turns[key]
            if users == 1:
                del self._turns[key]
            else:
                self._turns[key] = (lock, users - 1)

    async def _fetch_alone(
        self,
        key: str,
        where: Location,
        cache: ModelCache,
        options: LoadOptions,
        progress: Progress | None,
    ) -> CachedModel:
        self._fetching.add(key)
        try:
            return await self._fetch(key, where, cache, options, progress)
        except BaseException:
            manifest = self.manifests.get(key)
            if manifest is not None and manifest.state != "complete":
                await asyncio.shield(self._withdraw(key))  # nobody waits for a dead fetch
            raise
        finally:
            self._fetching.discard(key)
            self.supplies.pop(key, None)

    async def _fetch(
        self,
        key: str,
        where: Location,
        cache: ModelCache,
        options: LoadOptions,
        progress: Progress | None,
    ) -> CachedModel:
        url = where.first
        reads = self.reads.setdefault(key, Reads())  # over every try of the model
        manifest = self.manifests.setdefault(
            key,
            Manifest(key, url, self.node, self.advertised, origin_requests=self.origin_requests),
        )
        if manifest.state != "complete":
            # It takes part in the split unless a node holds the model (then it follows).
            self.manifests[key] = replace(manifest, state="fetching")
        answers = await self._survey(key)
        dead: set[str] = set()
        agreed: tuple[str, ...] = ()  # who pulls, once dealt: the same for every try
        while True:
            # The peers listed (this node among them, or not: its own answer is left
            # out), or the nodes heard and this one where more: alike on every node.
            cluster = max(len(set(self._apis)), len({a.node for a in answers} | {self.node}))
            dealt = deal(key, self.node, answers, dead, self.origin_requests, agreed, cluster)
            own = not agreed and not published(answers) and len(dealt.cohort) > 1
            if self.manifests[key].state != "complete":
                state: State = "following" if dealt.whole is not None else "fetching"
                if dealt.whole is None:
                    agreed = tuple(sorted(dealt.pullers or dealt.cohort))
                split = agreed if state == "fetching" else ()
                self.manifests[key] = replace(self.manifests[key], state=state, split=split)
                if own and state == "fetching":  # dealt its own: another may come first
                    answers, agreed = await confirmed(
                        self.node, key, self.wait, agreed, answers, self._peers, self.ask
                    )
                    self.manifests[key] = replace(self.manifests[key], split=agreed)
                    continue
            logger.info("%s: %s", url, dealt)
            route = Routes(dealt, {n: self._followed(key, lead) for n, lead in dealt.leads.items()})
            supply = self.supplies[key] = self._supply(key, reads, route, cache)
            fetching = options if dealt.whole is not None else leading(options, dealt.share)
            hearing = self._hearing(key, route, answers)
            try:
                work = cache.fetch(where, options=fetching, progress=progress, supply=supply)
                followed = list(route.followed.values())
                cached = await (watched(work, followed) if followed else work)
            except LoaderError as exc:
                culprit = supply.blamed  # a local or origin failure blames nobody
                if culprit is None:
                    raise
                logger.warning("%s: dropping %r: %s", url, route.followed[culprit], exc)
                dead.add(culprit)
                # Asked again: a listed node that still fetches nothing is out of the
                # split now (the first deal counts it: it may have been asked a moment
                # before its own request came), not dropped one try at a time.
                answers = await self._survey(key)
                dead |= {a.node for a in answers if a.manifest is None}
                continue
            finally:
                hearing.cancel()
                await asyncio.wait([hearing])
                if not hearing.cancelled() and hearing.exception() is not None:
                    logger.warning("%s: asking the unheard: %r", url, hearing.exception())
            break
        await self._seed_all(key, cached)
        self.manifests[key] = replace(self.manifests[key], state="complete")
        return cached

    def _followed(self, key: str, lead: Lead) -> Followed:
        asker = self._asker
        followed = Followed(
            lead.answer, key, self.ask, self.swarm.stall, self._gone(), self._torrent,
            late=(lambda api: api in asker.late) if asker is not None else lambda api: False,
            polls=self._polls, hold=HOLD,
        )  # fmt: skip
        followed.fetch_range = self._asker.range_torrent if self._asker else None
        followed.others = list(lead.others)
        followed.share = lead.share
        return followed

    def _hearing(self, key: str, route: Routes, answers: list[Answer]) -> asyncio.Task[None]:
        """Asks the peers silent so far while the try runs, for the pullers of its split
        not heard yet (hearing.py); their ranges wait meanwhile."""
        pullers, asker = route.deal.ranged() or [], self._asker
        assert asker is not None, "used outside its async with"
        answered = {a.api for a in answers}
        silent = [api for api in self._apis if api not in answered]

        def follow(answer: Answer) -> Followed:
            route.followed[answer.node] = self._followed(key, route.deal.lead(answer))
            return route.followed[answer.node]

        route.hearing.open = bool(silent and set(pullers) - set(route.followed) - {self.node})
        return asyncio.get_running_loop().create_task(
            hear(route.hearing, pullers, lambda: set(route.followed) | {self.node}, silent,
                 lambda api: self.ask(api, key), follow, self._gone(), self.swarm.stall,
                 lambda api: api in asker.late, self._polls.interval, asker.failed.get),
            name=f"aioloader hearing {key[:8]}",
        )  # fmt: skip

    async def _survey(self, key: str) -> list[Answer]:
        return await survey(self.node, key, self.wait, self._peers, self.ask)

    def _gone(self) -> float:
        """Seconds without an answer after which a followed node is taken for dead: three
        asks' worth, at least 3 s (a daemon answers at once, its loop never blocks)."""
        return max(3 * self.wait, 3.0)
