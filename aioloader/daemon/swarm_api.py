"""The routes peer daemons ask (behind the token, like every ``/v1/*`` route)::

    GET /v1/swarm/node          {"node": <id>, "swarm": "ip:port", "seeding": <files>}
    GET /v1/swarm/models/{key}  the model's manifest (swarm/manifest.py), or 404
                                {"error": "not_held", "node": <id>, "swarm": "ip:port"}

Without peers configured both answer 404 ``no_swarm``. A manifest never shows a
URL's credentials; its ``swarm`` address is this node's as the asking peer reached it
when the swarm listens on every interface. Both look at the seeded files first (a
``stat`` each, in a thread): a file that left the cache is never offered.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

__all__ = ["add_swarm_routes"]

_KEY = re.compile(r"^[0-9a-f]{64}$")


def _refusal(status: int, code: str, detail: str, **extra: Any) -> web.Response:
    return web.json_response({"error": code, "detail": detail, **extra}, status=status)


def _advertised(request: web.Request, coordinator: Any) -> str:
    host, _, port = coordinator.advertised.rpartition(":")
    if host.strip("[]") not in ("0.0.0.0", "::"):
        return str(coordinator.advertised)
    local = request.transport.get_extra_info("sockname") if request.transport else None
    ip = str(local[0]) if local else "127.0.0.1"
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def add_swarm_routes(app: web.Application, coordinator: Callable[[], Any]) -> None:
    """The two routes; ``coordinator()`` gives the daemon's (None without peers)."""

    def answering(
        handler: Callable[[web.Request, Any], Awaitable[web.Response]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            held = coordinator()
            if held is None:
                detail = "this daemon shares no models: start it with --peers"
                return _refusal(404, "no_swarm", detail)
            await held.check_held()
            return await handler(request, held)

        return handle

    async def node(request: web.Request, held: Any) -> web.Response:
        seeding = len(held.held)
        doc = {"node": held.node, "swarm": _advertised(request, held), "seeding": seeding}
        return web.json_response(doc)

    async def model(request: web.Request, held: Any) -> web.Response:
        key = request.match_info["key"]
        if not _KEY.match(key):
            detail = "a model key is 64 hex digits (sha256)"
            return _refusal(400, "bad_key", detail, node=held.node)
        manifest = held.manifests.get(key)
        if manifest is None:
            swarm = _advertised(request, held)  # a peer to trade pieces with all the same
            return _refusal(404, "not_held", "no such model here", node=held.node, swarm=swarm)
        return web.json_response(manifest.as_dict(_advertised(request, held)))

    app.router.add_get("/v1/swarm/node", answering(node))
    app.router.add_get("/v1/swarm/models/{key}", answering(model))
