"""``preload``: every node's cache filled, the nodes sharing one download.

One agent actor per node, pinned there by ``NodeAffinitySchedulingStrategy(soft=False)``,
runs the node's daemon (``aioloader serve``'s ``Server``) in its process, with a token
made for the preload; the driver gathers their addresses through Ray and gives each
agent the others as its peers, then all fetch at once through the daemon's swarm
(docs/ray.md). A node without libtorrent pulls its own copy, and a warning says what
that costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import string
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import ConfigError
from ..redact import redacting_logger
from ..settings.options import LoadOptions
from ..settings.values import MAX_SECONDS, check_number
from ..sources.stores import Location, locate

__all__ = ["NodePreload", "check_cache_dir", "preload"]

logger = redacting_logger(__name__)


@dataclass(frozen=True)
class NodePreload:
    """What ``preload`` did on one node.

    Attributes:
        node_id: Ray's id of the node.
        host: the node's address.
        cache_dir: the cache folder used on that node.
        fetched: bytes downloaded into the cache (from the origin and from peers).
        cached: bytes found in the cache already.
        seconds: wall time on the node.
        error: why the node failed, or None.
        from_origin: bytes of ``fetched`` read from the origin.
        from_peers: bytes of ``fetched`` that came from the other nodes (the swarm).
        shared: whether the node took part in the swarm (False: it pulled alone).
    """

    node_id: str
    host: str
    cache_dir: str
    fetched: int = 0
    cached: int = 0
    seconds: float = 0.0
    error: str | None = None
    from_origin: int = 0
    from_peers: int = 0
    shared: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


# Seconds an agent's daemon has to stop when a preload ends (then the actor is killed).
_GRACE = 5.0


@ray.remote(num_cpus=0)
class _Agent:
    """One node's part in a ``preload`` (one per node, for the time of the preload).

    With the swarm (libtorrent on the node), it runs the node's daemon in this process
    (aioloader/daemon/server.py) on the node's address, API and swarm on free ports
    unless told, with the preload's token; given the other agents' API addresses as
    its peers, it fetches through the daemon's swarm, so that the nodes split the
    model's files and each leaves the origin once. Without one, it fills the node
    cache alone, as a lone node would.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.server: Any = None
        self.task: asyncio.Task[int] | None = None

    async def start(
        self, host: str, token: str, swarm_port: int, share: bool | None
    ) -> dict[str, Any]:
        """``{"api": "host:port"}`` of the started daemon, or ``{"api": None, "why": ...}``
        where this node does not share (``share=True``: that is an error)."""
        if share is False:
            return {"api": None, "why": "share=False"}
        from ..swarm.torrents import libtorrent

        try:
            libtorrent()
        except ConfigError as exc:
            return _alone(host, share, str(exc))
        from ..daemon.config import DaemonConfig
        from ..daemon.server import Server

        config = DaemonConfig(
            host=host,
            port=0,
            cache_dir=Path(self.folder),
            token=token,
            swarm_port=swarm_port,
            grace_period=_GRACE,
        )
        server = Server(config, swarm=True)
        task = asyncio.get_running_loop().create_task(server.serve(), name="aioloader daemon")
        listening = asyncio.ensure_future(server.listening.wait())
        await asyncio.wait([task, listening], return_when=asyncio.FIRST_COMPLETED)
        if not server.listening.is_set():
            listening.cancel()
            code = task.result()
            return _alone(host, share, server.error or f"its daemon exited with status {code}")
        self.server, self.task = server, task
        return {"api": f"[{host}]:{server.port}" if ":" in host else f"{host}:{server.port}"}

    async def peers(self, apis: list[str]) -> None:
        """The other agents' daemons, as this daemon's peers."""
        self.server.set_peers(apis)

    async def ping(self) -> bool:  # whether its daemon runs (agents.py asks)
        return self.task is not None and not self.task.done()

    async def fetch(
        self, urls: list[Location], options: dict[str, Any], apis: list[str] | None = None
    ) -> dict[str, Any]:
        """Fetch ``urls`` into the node cache (``apis``: the other agents, as peers)."""
        from ..cache.model_cache import ModelCache
        from ..swarm.manifest import model_key

        cache = ModelCache(self.folder) if self.server is None else self.server.cache
        started = time.perf_counter()
        fetched = total = origin = peers = 0
        paths = []  # each model's local layout in the node cache (load_shared reads it)
        for url in urls:
            if self.server is None:
                model = await cache.fetch(url, **options)
                origin += model.downloaded
            else:
                coordinator = self.server.coordinator
                if apis is not None:
                    self.server.set_peers(apis)
                before = coordinator.reads.get(model_key(url.first))
                was = (before.origin, before.peers) if before is not None else (0, 0)
                model = await coordinator.fetch(url, cache, LoadOptions.build(**options))
                reads = coordinator.reads.get(model_key(url.first))
                if reads is not None:
                    origin += reads.origin - was[0]
                    peers += reads.peers - was[1]
            fetched, total = fetched + model.downloaded, total + model.bytes
            paths.append(model.path)
        return {
            "fetched": fetched,
            "cached": total - fetched,
            "seconds": time.perf_counter() - started,
            "from_origin": origin,
            "from_peers": peers,
            "paths": paths,
        }

    async def stop(self) -> None:
        """Stop the daemon (within its grace period)."""
        if self.server is not None and self.task is not None:
            self.server.request_exit()
            await asyncio.wait([self.task], timeout=_GRACE + 1)


def _alone(host: str, share: bool | None, why: str) -> dict[str, Any]:
    if share:
        raise ConfigError(
            f"node {host} cannot share downloads (share=True): {why}; install "
            "aioloader[swarm] (libtorrent) on every node and open the swarm port between "
            "nodes, or pass share=None to let such a node pull alone"
        )
    return {"api": None, "why": why}


_FIELDS = ("node_id", "node_ip")


def check_cache_dir(cache_dir: object) -> str:
    """``cache_dir`` if it is a folder template ``preload`` can fill: text whose only
    fields are ``{node_id}`` and ``{node_ip}`` (``{{`` and ``}}`` for braces).

    Raises:
        ConfigError: naming the template and what is wrong with it.
    """
    if not isinstance(cache_dir, str | os.PathLike):
        raise ConfigError(f"cache_dir must be a folder path, got {cache_dir!r}")
    template = os.fspath(cache_dir)
    if not isinstance(template, str) or not template:
        raise ConfigError(f"cache_dir must be a non-empty folder path, got {cache_dir!r}")
    hint = "; the only fields are {node_id} and {node_ip} (write {{ and }} for braces)"
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"cache_dir {template!r}: {exc}{hint}") from None
    for _text, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in _FIELDS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise ConfigError(f"cache_dir {template!r}: {shown} cannot be filled in{hint}")
    return template


def _cache_dir_for(cache_dir: str, node: dict[str, Any]) -> str:
    """``cache_dir`` (checked by ``check_cache_dir``) filled in for ``node``."""
    return cache_dir.format(node_id=node["NodeID"], node_ip=node["NodeManagerAddress"])


def check_sharing(share: object, swarm_port: object) -> None:
    """Refuse a ``share`` that is not None, True or False, and a ``swarm_port`` that is
    not a port number (0: a free one).

    Raises:
        ConfigError: naming the option and the value.
    """
    if share is not None and not isinstance(share, bool):
        raise ConfigError(
            f"share must be None (share where the nodes can), True (every node must) or "
            f"False (every node pulls alone), got {share!r:.80}"
        )
    check_number("swarm_port", swarm_port, integer=True, maximum=65535)


def preload(
    urls: str | Sequence[str],
    *,
    cache_dir: str,
    nodes: Sequence[str] | None = None,
    timeout: float | None = None,
    share: bool | None = None,
    swarm_port: int = 0,
    **options: Any,
) -> list[NodePreload]:
    """Fill the node cache of every alive node (or of ``nodes``) with the models at ``urls``,
    the origin sending about one copy for the whole cluster.

    One agent actor per node runs the node's daemon with its swarm (docs/swarm.md),
    its peers the other agents, found through Ray; the nodes split each model's files,
    pull their share from the origin and trade the rest (docs/ray.md).

    Args:
        urls: model URLs (``s3://``, ``http(s)://``), as ``ModelCache.fetch`` takes them.
        cache_dir: the cache folder on each node; ``{node_id}`` and ``{node_ip}`` are
            replaced with the node's (for nodes that share one file system).
        nodes: Ray node ids; default every alive node.
        timeout: seconds to wait for all nodes; a node not done by then is reported
            failed (its actor is killed).
        share: None: the nodes share where they can (libtorrent installed, the swarm
            started); a node that cannot pulls its own copy, and a warning says so.
            True: a node that cannot share fails. False: every node pulls alone.
        swarm_port: the port each node's swarm listens on (0: a free one); it must be
            open between the nodes.
        options: how each node reads, as ``ModelCache.fetch`` takes them
            (``concurrency``, ``chunk_size``, ``headers``, retries, ``s3_*``: see
            aioloader/settings/options.py); checked here, before any actor starts.

    Returns:
        One NodePreload per node, in the order of ``nodes`` (or Ray's); a node that
        failed has ``error`` set, and the others are reported as they are.
    """
    cache_dir = check_cache_dir(cache_dir)
    check_sharing(share, swarm_port)
    for name in ("device", "framework", "group", "cache_dir"):
        if options.get(name) is not None:
            raise ConfigError(f"preload fills node caches; {name}= is for loads, not preloads")
    LoadOptions.build(environ={}, **options)  # refused here, not on every node
    if timeout is not None:
        check_number("timeout", timeout, maximum=MAX_SECONDS)
    # Each model's URL parsed once, here: the nodes fetch the Location (a bad URL fails
    # before any actor starts).
    url_list = [locate(u) for u in ([urls] if isinstance(urls, str) else list(urls))]
    if not url_list:
        raise ConfigError("preload: no model URL given; pass one URL or a list of them")
    if not ray.is_initialized():
        ray.init()
    alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    wanted = list(nodes) if nodes is not None else list(alive)
    results: dict[str, NodePreload] = {}
    # The cluster's token for this preload: handed to the agents by Ray, in no name or log.
    token = secrets.token_urlsafe(32)
    run = secrets.token_hex(4)
    agents: dict[str, Any] = {}
    where: dict[str, tuple[str, str]] = {}  # node id -> (host, cache folder)
    for node_id in dict.fromkeys(wanted):
        node = alive.get(node_id)
        if node is None:
            results[node_id] = NodePreload(node_id, "", "", error="no alive Ray node has this id")
            continue
        where[node_id] = (node["NodeManagerAddress"], _cache_dir_for(cache_dir, node))
        agents[node_id] = _Agent.options(  # type: ignore[attr-defined]
            name=f"aioloader-preload-{run}-{node_id[:16]}",
            namespace="aioloader",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(where[node_id][1])
    deadline = None if timeout is None else time.monotonic() + timeout

    def failed(node_id: str, error: str) -> None:
        host, folder = where[node_id]
        results[node_id] = NodePreload(node_id, host, folder, error=error)

    try:
        starts = {
            n: agent.start.remote(where[n][0], token, swarm_port, share)
            for n, agent in agents.items()
        }
        apis: dict[str, str] = {}
        alone: dict[str, str] = {}
        for node_id, (got, error) in _gather(starts, deadline, timeout).items():
            if error is not None:
                failed(node_id, f"starting its agent: {error}")
            elif got["api"] is not None:
                apis[node_id] = got["api"]
            else:
                alone[node_id] = got["why"]
        if alone and share is None:
            _warn_alone(alone, where, len(apis) + len(alone))
        # Every sharing agent knows every other before any fetch starts.
        told = {n: agents[n].peers.remote([api for m, api in apis.items() if m != n]) for n in apis}
        for node_id, (_, error) in _gather(told, deadline, timeout).items():
            if error is not None:
                failed(node_id, f"giving its daemon its peers: {error}")
        fetches = {n: agents[n].fetch.remote(url_list, options) for n in agents if n not in results}
        for node_id, (got, error) in _gather(fetches, deadline, timeout).items():
            if error is not None:
                failed(node_id, error)
                continue
            host, folder = where[node_id]
            results[node_id] = NodePreload(
                node_id, host, folder, got["fetched"], got["cached"], got["seconds"],
                from_origin=got["from_origin"], from_peers=got["from_peers"],
                shared=node_id in apis,
            )  # fmt: skip
    finally:
        _stop(list(agents.values()))
    return [results[n] for n in wanted]


def _gather(
    refs: Mapping[str, Any], deadline: float | None, timeout: float | None
) -> dict[str, tuple[Any, str | None]]:
    """Each node's result, or why it has none: its error, or not done by ``deadline``."""
    out: dict[str, tuple[Any, str | None]] = {}
    for node_id, ref in refs.items():
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            out[node_id] = (ray.get(ref, timeout=left), None)
        except ray.exceptions.GetTimeoutError:
            out[node_id] = (None, f"not done within {timeout} s")
        except Exception as exc:
            out[node_id] = (None, _cause(exc))
    return out


def _warn_alone(alone: Mapping[str, str], where: Mapping[str, Any], count: int) -> None:
    """Say which nodes pull their own copy, why, and what it costs the origin."""
    copies = len(alone) + (1 if count > len(alone) else 0)
    shown = "; ".join(f"{n[:8]} ({where[n][0]}): {why}" for n, why in alone.items())
    text = (
        f"aioloader.ray.preload: {len(alone)} of {count} nodes cannot share the download "
        f"and each pulls its own copy, so the origin sends about {copies}x the model "
        f"instead of 1x ({shown}); install aioloader[swarm] (libtorrent) on every node and "
        "open the swarm port between nodes (docs/ray.md), or pass share=False to say "
        "that every node pulls alone"
    )
    logger.warning("%s", text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)


def _stop(agents: list[Any]) -> None:
    """Stop the agents' daemons (their grace period, at most), then the agents."""
    stops = [agent.stop.remote() for agent in agents]
    with contextlib.suppress(Exception):
        ray.wait(stops, num_returns=len(stops), timeout=_GRACE + 2)
    for agent in agents:
        ray.kill(agent)


def _cause(exc: BaseException) -> str:
    """The error behind a Ray exception, in a line."""
    cause = getattr(exc, "cause", None) or exc
    return f"{type(cause).__name__}: {cause}".splitlines()[0]
