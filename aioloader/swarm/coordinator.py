"""Per model, and per file of it, whom a daemon follows, or whether it pulls from the
origin itself.

``Coordinator.fetch(url)``:

1. ask every peer ``GET /v1/swarm/models/{key}`` at once, within ``wait`` seconds;
   while nobody holds the model or pulls it and some listed peers have not answered,
   ask again for up to ``SETTLE`` times ``wait`` (a cold cluster's daemons start
   within seconds of each other: one not listening yet must not be ranked out; a
   peer that never comes costs that much, once);
2. a peer that holds the model whole is followed for every file (``Plan.whole``);
3. nobody holds it (a cold cluster): the nodes that answered, but those following a
   holder, and this one split the files: each file is pulled from the origin by the
   first node of its own ranking (rendezvous.py, keyed by model and file name), who
   publishes its torrent as soon as it commits it, and every other node follows that
   node for that file. Every node's link to the origin works at once and each file
   leaves the origin once; a model of one file has one leader. A node in the split
   says ``fetching``; one following a holder says ``following`` and leads nothing;
4. a followed node stalls, goes away or sends bytes the cache refuses: it is dropped
   and the rest ranked again, which may make this node the one to pull its files from
   the origin (files already in the cache are not fetched again).

Before it follows anyone for a file, a node asks the origin for the file's current
version (swarm/source.py): a file its cache holds at that version is offered at once
(a warm fleet restarted all at once gets ready without waiting for each other), and a
followed node's copy of another version is never taken. After a fetch, this node
offers every file of the model (seeded from its cache entries) and its manifest says
``complete``. Two fetches of one model on one node take turns: the second finds the
first's files in the cache.

Peers prove they hold the cluster's token both ways without sending it (proof.py,
asking.py); the swarm's IP filter follows the proven peers (admission.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import LoaderError
from ..redact import redacting_logger
from ..sources.base import Current, Source
from .admission import Admission
from .asking import Asker
from .deal import Plan, share_of, watched
from .follower import Answer, Follower, known_torrent, leads
from .manifest import (
    FileOffer,
    Manifest,
    State,
    file_name,
    model_key,
)
from .offers import Offers
from .peers import PeerAddress
from .proof import PeerProof
from .session import Swarm, SwarmError
from .source import Reads, SwarmSource

__all__ = ["Coordinator", "Follower"]

logger = redacting_logger(__name__)

SETTLE = 5  # times ``wait``: how long silent peers are asked again before ranking
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
    ) -> None:
        super().__init__(swarm, node, advertised)
        self.peers = peers
        self.wait = wait
        self.scratch = scratch
        self.reads: dict[str, Reads] = {}
        self.proof = PeerProof(token)
        self.admission = Admission(swarm, peers, self.proof.enabled)
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # a model's fetches, in turn
        self._watch: asyncio.Task[None] | None = None
        self._client: Any = None
        self._asker: Asker | None = None
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
        try:
            if self._watch is not None:
                self._watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._watch
            if self._client is not None:
                await self._client.close()
        finally:
            self.close()
            self.admission.close()

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

    async def ask(self, api: str, key: str) -> Answer | None:
        """A peer's answer about the model ``key`` (None: no usable answer, or no proof
        that it holds the token); a proven peer's swarm address is admitted."""
        assert self._asker is not None, "used outside its async with"
        answer = await self._asker.ask(api, key)
        if answer is not None:
            await self.admission.learn([answer.swarm])
        return answer

    async def _torrent(self, api: str, offer: FileOffer) -> bytes | None:
        """The torrent of a peer's ``offer``, fetched by its info hash and checked."""
        assert self._asker is not None, "used outside its async with"
        return await self._asker.torrent(api, offer)

    async def admit(self, swarm: str, remote: str | None) -> None:
        """A peer that proved it holds the token asked from ``remote``, its swarm at
        ``swarm``: both are let through the swarm's filter (swarm_api.py)."""
        await self.admission.learn([swarm, remote])

    # -- one try of a fetch ----------------------------------------------------------------

    def _attempt(
        self, key: str, reads: Reads, plan: Plan, cache: Any
    ) -> tuple[
        Callable[[Source, Executor], Source],
        Callable[[str, Path, Any], Awaitable[None]],
        list[SwarmSource],
    ]:
        """A try's source hook (the origin behind a SwarmSource), on_file callback, and
        the sources the hook made."""
        made: list[SwarmSource] = []

        async def held(url: str, current: Current) -> Path | None:
            return await self._held_here(key, cache, url, current)

        def hook(origin: Source, lane: Executor) -> Source:
            made.append(
                SwarmSource(
                    origin, lane, self.swarm, self.scratch, reads, plan, self._note(key), held
                )
            )
            return made[-1]

        return hook, self._on_file(key, plan, made), made

    def _on_file(
        self, key: str, plan: Plan | None = None, sources: list[SwarmSource] | None = None
    ) -> Callable[[str, Path, Any], Awaitable[None]]:
        async def on_file(url: str, data: Path, version: Any) -> None:
            size, etag, name = version.size, version.etag, file_name(url)
            known = known_torrent(plan(name) if plan else None, name, size, etag)
            try:
                await self._publish(key, url, data, size, etag, version.last_modified, known)
            finally:
                # Seeded from the cache entry now: its download goes (and a scratch copy
                # at once, most of it before the kernel writes it back to disk).
                for source in sources or ():
                    await source.release(name)

        return on_file

    # -- a fetch --------------------------------------------------------------------------

    async def fetch(self, url: str, cache: Any, **kwargs: Any) -> Any:
        """``cache.fetch(url, source=..., on_file=..., **kwargs)`` (a ModelCache's)
        through the swarm; returns its CachedModel. Fetches of one model take turns."""
        key = model_key(url)
        lock, users = self._turns.get(key, (asyncio.Lock(), 0))
        self._turns[key] = (lock, users + 1)
        try:
            async with lock:
                return await self._fetch_alone(key, url, cache, **kwargs)
        finally:
            lock, users = self._turns[key]
            if users == 1:
                del self._turns[key]
            else:
                self._turns[key] = (lock, users - 1)

    async def _fetch_alone(self, key: str, url: str, cache: Any, **kwargs: Any) -> Any:
        self._fetching.add(key)
        try:
            return await self._fetch(key, url, cache, **kwargs)
        except BaseException:
            manifest = self.manifests.get(key)
            if manifest is not None and manifest.state != "complete":
                await asyncio.shield(self._withdraw(key))  # nobody waits for a dead fetch
            raise
        finally:
            self._fetching.discard(key)

    async def _fetch(self, key: str, url: str, cache: Any, **kwargs: Any) -> Any:
        reads = self.reads.setdefault(key, Reads())  # over every try of the model
        manifest = self.manifests.setdefault(key, Manifest(key, url, self.node, self.advertised))
        if manifest.state != "complete":
            # It takes part in the split unless a node holds the model (then it follows).
            self.manifests[key] = replace(manifest, state="fetching")
        answers = await self._survey(key)
        dead: set[str] = set()
        while True:
            plan = self._plan(key, answers, dead)
            if self.manifests[key].state != "complete":
                state: State = "following" if plan.whole is not None else "fetching"
                self.manifests[key] = replace(self.manifests[key], state=state)
            logger.info("%s: %s", url, plan)
            hook, on_file, made = self._attempt(key, reads, plan, cache)
            try:
                work = cache.fetch(url, source=hook, on_file=on_file, **plan.options(kwargs))
                followed = list(plan.followers.values())
                cached = await (watched(work, followed) if followed else work)
            except (SwarmError, LoaderError) as exc:
                culprit = plan.culprit(exc, made)
                if culprit is None:
                    raise
                logger.warning("%s: dropping %r: %s", url, plan.followers[culprit], exc)
                dead.add(culprit)
                # Asked again: a listed node that still fetches nothing is out of the
                # split now (the first plan counts it: it may have been asked a moment
                # before its own request came), not dropped one try at a time.
                answers = await self._survey(key)
                dead |= {a.node for a in answers if a.manifest is None}
                continue
            break
        await self._seed_all(key, cached)
        self.manifests[key] = replace(self.manifests[key], state="complete")
        return cached

    async def _survey(self, key: str) -> list[Answer]:
        """The other nodes' answers about ``key``: asked again while nobody holds or pulls
        it and some listed peer is silent, for ``SETTLE`` times ``wait`` at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE * self.wait
        while True:
            apis = await self._peers()
            found = await _gather(self.ask(api, key) for api in apis)
            answers = [a for a in found if a is not None and a.node != self.node]
            silent = sum(1 for a in found if a is None)
            if not silent or any(leads(a) for a in answers) or loop.time() >= deadline:
                return answers
            await asyncio.sleep(min(self.wait, max(0.0, deadline - loop.time())))

    def _gone(self) -> float:
        """Seconds without an answer after which a followed node is taken for dead: three
        asks' worth, at least 3 s (a daemon answers at once, its loop never blocks)."""
        return max(3 * self.wait, 3.0)

    def _plan(self, key: str, answers: list[Answer], dead: set[str]) -> Plan:
        alive = [a for a in answers if a.node not in dead]
        swarms = [a.swarm for a in alive if a.swarm]
        holders = [a for a in alive if a.manifest is not None and a.manifest.state == "complete"]
        if holders:
            holder = min(holders, key=lambda a: a.node)
            follow = Follower(holder, key, self.ask, self.swarm.stall, self._gone(), self._torrent)
            follow.others = [s for s in swarms if s != holder.swarm]
            follow.share = share_of(self.node, [a.node for a in alive], holder.node)
            return Plan(key, self.node, [self.node], {holder.node: follow}, whole=follow)
        # A node following a holder leads nothing: it is not counted in the split.
        split = [a for a in alive if a.manifest is None or a.manifest.state != "following"]
        cohort = sorted({a.node for a in split} | {self.node})
        followers = {}
        for answer in split:
            follow = Follower(answer, key, self.ask, self.swarm.stall, self._gone(), self._torrent)
            follow.others = [s for s in swarms if s != answer.swarm]
            follow.share = share_of(self.node, cohort, answer.node)
            followers[answer.node] = follow
        # A file a node lists already (it holds it, or pulls it from the origin) is
        # followed there, whatever the ranking says: a node that joins a split late
        # pulls nothing twice.
        listed: dict[str, str] = {}
        for answer in sorted(split, key=lambda a: a.node):
            for offer in answer.manifest.files if answer.manifest else ():
                if offer.info_hash is not None or offer.name not in listed:
                    listed[offer.name] = answer.node
        return Plan(key, self.node, cohort, followers, listed=listed)


async def _gather(coros: Any) -> list[Any]:
    from ..runtime.tasks import gather

    results: list[Any] = []

    async def one(coro: Awaitable[Any]) -> None:
        results.append(await coro)

    await gather(one(c) for c in coros)
    return results
