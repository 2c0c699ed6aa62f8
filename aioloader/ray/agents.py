"""The cluster's agents for ``load_shared``: one swarm daemon per node, found through Ray.

A detached registry actor (``aioloader-registry`` in the namespace ``aioloader``) makes
the cluster's token once and keeps the live agents: per cache folder template, one
agent per node (preload.py's ``_Agent``, pinned to its node, named after it), which runs
the node's daemon with its swarm. A holder asks the registry for its node's agent (the
registry starts it where there is none, or where the one it had stopped answering). An
agent that joins is given to the others at once (``set_peers``), and agents starting at
the same moment wait for each other before any fetches. The agents are the registry's
own actors: they live as long as it does. ``stop_agents()`` stops them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import warnings
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..redact import redact, redacting_logger
from ..sources.stores import Location
from .preload import _GRACE, _Agent

__all__ = ["REGISTRY", "share_into_cache", "stop_agents"]

logger = redacting_logger(__name__)

REGISTRY = "aioloader-registry"
_PING = 10.0  # seconds an agent has to say it runs before the registry counts it gone
_SETTLE = 30.0  # seconds an agent's start waits for the others starting at the same time


def _agent_name(node_id: str, template: str) -> str:
    digest = hashlib.blake2b(template.encode(), digest_size=4).hexdigest()
    return f"aioloader-agent-{node_id}-{digest}-{secrets.token_hex(3)}"


@ray.remote(num_cpus=0)
class _Registry:
    """The cluster's token and its live agents: ``{(template, node id): (agent, api)}``."""

    def __init__(self) -> None:
        self._token = secrets.token_urlsafe(32)  # handed to agents only, never logged
        self._agents: dict[tuple[str, str], tuple[Any, str]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._starting: dict[str, set[str]] = {}  # per template: nodes whose agent starts
        self._why: dict[tuple[str, str], str] = {}  # why a node's agent could not share
        self._changed: dict[str, asyncio.Condition] = {}  # a start of the template ended

    async def agent(
        self, node_id: str, host: str, template: str, folder: str, swarm_port: int, share: Any
    ) -> dict[str, Any]:
        """``{"agent": handle, "peers": [api, ...]}`` for the node, or ``{"agent": None,
        "why": ...}`` where it cannot share (``share=True``: a ConfigError instead)."""
        key = (template, node_id)
        starting = self._starting.setdefault(template, set())
        changed = self._changed.setdefault(template, asyncio.Condition())
        starting.add(node_id)
        try:
            await self._start(key, host, folder, swarm_port, share)
        finally:
            starting.discard(node_id)
            async with changed:
                changed.notify_all()
        # Agents that start at the same moment know each other before either fetches: a
        # fetch that began alone would pull what a node joining a moment later pulls too.
        async with changed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait_for(lambda: not starting), _SETTLE)
        if key not in self._agents:
            return {"agent": None, "why": self._why.pop(key, "its agent did not start")}
        handle, api = self._agents[key]
        return {"agent": handle, "peers": self._peers(template, api)}

    async def _start(
        self, key: tuple[str, str], host: str, folder: str, swarm_port: int, share: Any
    ) -> None:
        template, node_id = key
        async with self._locks.setdefault(key, asyncio.Lock()):
            await self._prune(template)
            if key not in self._agents:
                handle = _Agent.options(  # type: ignore[attr-defined]
                    name=_agent_name(node_id, template),
                    namespace="aioloader",
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                ).remote(folder)
                try:
                    got = await handle.start.remote(host, self._token, swarm_port, share)
                except BaseException:
                    ray.kill(handle)
                    raise
                if got["api"] is None:
                    ray.kill(handle)
                    self._why[key] = got["why"]
                    return
                self._agents[key] = (handle, got["api"])
                await self._tell(template)

    def _peers(self, template: str, api: str) -> list[str]:
        return [a for (t, _), (_, a) in self._agents.items() if t == template and a != api]

    async def _prune(self, template: str) -> None:
        """Forget the agents of ``template`` that do not say they run."""
        keys = [k for k in self._agents if k[0] == template]
        answers = await asyncio.gather(
            *(asyncio.wait_for(_answer(self._agents[k][0].ping.remote()), _PING) for k in keys),
            return_exceptions=True,
        )
        gone = [k for k, answer in zip(keys, answers, strict=True) if answer is False or (
            isinstance(answer, Exception) and not isinstance(answer, asyncio.TimeoutError)
        )]  # fmt: skip
        for key in gone:
            logger.info("agent of node %s stopped answering; a new one starts", key[1][:8])
            handle, _ = self._agents.pop(key)
            with contextlib.suppress(Exception):
                ray.kill(handle)
        if gone:
            await self._tell(template)

    async def _tell(self, template: str) -> None:
        """Every agent of ``template``: the others, as its daemon's peers."""
        agents = [(h, a) for (t, _), (h, a) in self._agents.items() if t == template]
        await asyncio.gather(
            *(h.peers.remote(self._peers(template, a)) for h, a in agents),
            return_exceptions=True,
        )

    async def stop(self) -> int:
        """Stop every agent's daemon (within its grace period), then the agents."""
        handles = [h for h, _ in self._agents.values()]
        self._agents.clear()
        stops = asyncio.gather(*(_answer(h.stop.remote()) for h in handles), return_exceptions=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stops, _GRACE + 2)
        for handle in handles:
            with contextlib.suppress(Exception):
                ray.kill(handle)
        return len(handles)


async def _answer(ref: Any) -> Any:
    return await ref


def _registry() -> Any:
    return _Registry.options(  # type: ignore[attr-defined]
        name=REGISTRY, namespace="aioloader", get_if_exists=True, lifetime="detached"
    ).remote()


async def share_into_cache(
    url: Location, options: dict[str, Any], template: str, folder: str, swarm_port: int,
    share: Any,
) -> dict[str, Any]:  # fmt: skip
    """Have this node's agent fetch ``url`` into ``folder`` through the swarm.

    Returns ``{"path": the model's local layout in the node cache}``, or ``{"alone":
    why}`` where the node cannot share or its agent's fetch failed (then the caller
    loads alone, and meets an origin's refusal itself); ``share=True`` raises instead.
    """
    node_id = ray.get_runtime_context().get_node_id()
    host = ray.util.get_node_ip_address()
    for attempt in range(2):
        got = await _registry().agent.remote(node_id, host, template, folder, swarm_port, share)
        if got["agent"] is None:
            return {"alone": str(got["why"])}
        try:
            done = await got["agent"].fetch.remote([url], options)
            return {"path": done["paths"][0]}
        except ray.exceptions.RayActorError:
            if attempt:  # the new agent died too
                raise
        except Exception as exc:  # the swarm's fetch failed: the holder loads alone
            if share:
                raise
            cause = getattr(exc, "cause", None) or exc
            why = f"{type(cause).__name__}: {cause}".splitlines()[0]
            return {"alone": f"its agent's fetch failed ({why})"}
    raise AssertionError("unreachable")


def warn_alone(node_id: str, host: str, url: str, why: str) -> None:
    """Say that this node pulls its own copy, why, and what it costs the origin."""
    text = (
        f"aioloader.ray.load_shared: node {node_id[:8]} ({host}) cannot share the download "
        f"of {redact(url)} and pulls its own copy, so the origin sends about 1x the model more for "
        f"this node (Nx for N such nodes instead of 1x) ({why}); install aioloader[swarm] "
        "(libtorrent) on every node and open the swarm port between nodes (docs/ray.md), "
        "or pass share=False to say that every node pulls alone"
    )
    logger.warning("%s", text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)


def stop_agents() -> int:
    """Stop the agents that ``load_shared`` started (their daemons within a few seconds)
    and the registry; the node caches keep their files, and the holders their tensors.
    The next ``load_shared`` starts them again. Returns how many agents were stopped."""
    if not ray.is_initialized():
        ray.init()
    try:
        registry = ray.get_actor(REGISTRY, namespace="aioloader")
    except ValueError:
        return 0
    try:
        stopped = int(ray.get(registry.stop.remote(), timeout=_GRACE + 30))
    finally:
        ray.kill(registry)
    return stopped
