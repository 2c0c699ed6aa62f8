"""This node's view of its swarm (``own_view``) and the cluster's (``cluster_view``): the
values of view.py, filled from what the node tracks, never from what it was told.

Per model: its manifest (the state, each file's size and the bytes pulled of it), the
running fetch's supply (how each file comes: the origin, the cache, or a followed node),
the bytes counted from the origin and from peers with their rates (counts.py), and
libtorrent's status of each torrent (the download and upload rates, the peers connected,
the bytes checked), read with the session's alerts four times a second (session.py):
looking costs no call into libtorrent.

A file's role: ``origin``, this node pulls it from the origin now; ``follows``, it
downloads it from the node ``follows``; ``holds``, it is whole here (and offered to the
peers); ``seeds``, whole here and going out to peers connected now; ``waiting``, the fetch has
not decided yet how it comes. A file dealt in byte ranges is ``origin``, and lists how
each of its ranges comes (``Ranged.roles``).

``cluster_view`` asks every peer for its own view at once, each within ``wait``
seconds: a peer that does not answer, answers garbage or too much is listed
``unreachable`` with the reason, and never holds the answer longer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from ..redact import redact
from .counts import Reads
from .manifest import Manifest
from .session import Swarm
from .supply import FileWay
from .view import ClusterView, FileView, ModelView, NodeView, Unreachable

__all__ = ["cluster_view", "own_view"]

AskView = Callable[[str], Awaitable[NodeView]]


def _file(
    name: str,
    manifest: Manifest | None,
    way: FileWay | None,
    reads: Reads | None,
    swarm: Swarm,
) -> FileView:
    offer = manifest.file(name) if manifest is not None else None
    counted = reads.files.get(name) if reads is not None else None
    origin = counted.origin.total if counted is not None else 0
    peers = counted.peers.total if counted is not None else 0
    size = offer.size if offer is not None else (way.size if way is not None else 0) or 0
    seeded = offer is not None and offer.info_hash is not None and swarm.seeding(offer.info_hash)
    if offer is not None and offer.info_hash is not None and seeded:
        status = swarm.counts(offer.info_hash)
        up, connected = (status.upload_rate, status.peers) if status is not None else (0, 0)
        return FileView(
            name, size, size, "seeds" if up > 0 and connected else "holds", upload_rate=up,
            peers=connected,
            bytes_from_origin=origin, bytes_from_peers=peers,
        )  # fmt: skip
    if way is not None and way.kind == "follow":
        status = swarm.counts(way.info_hash) if way.info_hash is not None else None
        if status is not None:
            done, rate, connected = status.done, float(status.download_rate), status.peers
        else:
            done, connected = peers, 0
            rate = counted.peers.rate() if counted is not None else 0.0
        return FileView(
            name, size, done, "follows", way.node, way.api, rate, peers=connected,
            bytes_from_origin=origin, bytes_from_peers=peers,
        )  # fmt: skip
    if way is not None and way.kind == "deciding":
        return FileView(name, size, 0, "waiting", bytes_from_origin=origin, bytes_from_peers=peers)
    if way is not None and way.kind == "held":
        return FileView(name, size, size, "holds", bytes_from_origin=origin, bytes_from_peers=peers)
    if (way is not None and way.kind == "origin") or offer is not None:
        done = offer.done if offer is not None else origin
        rate = counted.origin.rate() if counted is not None else 0.0
        ranges = way.ranges if way is not None else ()
        if ranges:  # its ranges come from the origin and from their pullers
            done = sum(r.done for r in ranges)
            rate += counted.peers.rate() if counted is not None else 0.0
        return FileView(
            name, size, done, "origin", rate=rate,
            bytes_from_origin=origin, bytes_from_peers=peers, ranges=ranges,
        )  # fmt: skip
    return FileView(name, size, 0, "waiting", bytes_from_origin=origin, bytes_from_peers=peers)


def own_view(
    node: str,
    api: str | None,
    swarm_address: str,
    swarm: Swarm,
    manifests: Mapping[str, Manifest],
    reads: Mapping[str, Reads],
    ways: Mapping[str, dict[str, FileWay]],
) -> NodeView:
    """This node's view: each model it offers or fetches (``manifests``; ``ways``: how
    the files of each running fetch come; ``reads``: the bytes counted per model)."""
    models = []
    for key in sorted(set(manifests) | set(ways)):
        manifest, found, counted = manifests.get(key), ways.get(key, {}), reads.get(key)
        names = [f.name for f in manifest.files] if manifest is not None else []
        names += sorted(set(found) - set(names))
        files = tuple(_file(n, manifest, found.get(n), counted, swarm) for n in names)
        models.append(
            ModelView(
                key,
                redact(manifest.url) if manifest is not None else "",
                manifest.state if manifest is not None else "following",
                files,
                counted.origin if counted is not None else 0,
                counted.peers if counted is not None else 0,
            )
        )
    every = [f for m in models for f in m.files]
    return NodeView(
        node,
        api,
        swarm_address,
        time.time(),
        tuple(models),
        sum(r.origin for r in reads.values()),
        sum(r.peers for r in reads.values()),
        sum(f.rate for f in every),
        sum(f.upload_rate for f in every),
        swarm.statistics().banned,
    )


async def cluster_view(own: NodeView, apis: list[str], ask: AskView, wait: float) -> ClusterView:
    """``own`` and the view of every peer at ``apis`` (asked at once, each within ``wait``
    seconds; ``ask`` raises with the reason when a peer gives none). A peer answering for
    a node listed already (this one, reached through a name that resolves to every
    daemon) is left out."""

    async def one(api: str) -> NodeView | Unreachable:
        try:
            async with asyncio.timeout(wait):
                return await ask(api)
        except TimeoutError:
            return Unreachable(api, f"no answer within {wait:g} s")
        except (OSError, ValueError) as exc:  # the asker's NoAnswer, a ViewError
            return Unreachable(api, str(exc) or type(exc).__name__)

    from ..runtime.tasks import gather

    results: dict[str, NodeView | Unreachable] = {}

    async def into(api: str) -> None:
        results[api] = await one(api)

    await gather(into(api) for api in sorted(set(apis)))
    nodes, seen, unreachable = [own], {own.node}, []
    for api in sorted(results):
        found = results[api]
        if isinstance(found, Unreachable):
            unreachable.append(found)
        elif found.node not in seen:
            seen.add(found.node)
            nodes.append(found)
    return ClusterView(tuple(nodes), tuple(unreachable))
