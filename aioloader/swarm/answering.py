"""The routes peer daemons ask::

    GET /v1/swarm/node          {"node": <id>, "swarm": "ip:port", "seeding": <files>}
    GET /v1/swarm/models/{key}  the model's manifest (swarm/manifest.py), or 404
                                {"error": "not_held", "node": <id>, "swarm": "ip:port"}
    GET /v1/swarm/torrents/{h}  the torrent with the v2 info hash ``h`` of a file this
                                node offers (a manifest names torrents by their hash)
    GET /v1/swarm/view[?cluster=1]
                                the cluster's view (swarm/view.py): this node's, and
                                with ``cluster=1`` every peer's, asked at once, each
                                within ``--swarm-wait``; for an operator (the bearer
                                token), and a peer asks it of each node (its own only)

A peer proves it holds the cluster's token without sending it (swarm/proof.py): its
request is signed in ``X-Aioloader-Peer``, checked here before anything is answered
(401 ``peer_unproven`` otherwise), and the answer is signed in ``X-Aioloader-Proof``
for the peer to check in turn. A proven peer's swarm address is let through the
swarm's IP filter at once (``Coordinator.admit``): a pod back on a new address is
served by an idle holder. An operator may still ask with the bearer token (no proof
then, and none given).

A manifest answer carries an ETag; ``If-None-Match`` with it gets a 304, and the
encoded manifest is kept until it changes: a follower asking again costs neither an
encoding nor the torrents sent again. With ``Prefer: wait=N`` too, an unchanged
manifest's ask is held until it changes (answered then, at once) or for ``N`` seconds
(``MAX_HOLD`` at most; then the 304), ``MAX_HELD`` asks at once at most (changes.py);
a daemon stopping answers them all.

Without peers configured both answer 404 ``no_swarm``. A manifest never shows a
URL's credentials; its ``swarm`` address is this node's as the asking peer reached it
when the swarm listens on every interface. Both look at the seeded files first (a
``stat`` each, in a thread): a file that left the cache is never offered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from ..redact import redacting_logger
from .changes import MAX_HOLD
from .manifest import Manifest
from .proof import ANSWER_HEADER, REQUEST_HEADER, PeerProof, ProofError, ReplayedRequest
from .view import ClusterView

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["add_swarm_routes"]

logger = redacting_logger(__name__)

MAX_HELD = 256  # asks held at once; past it an unchanged manifest is answered at once
_RECHECK = 1.0  # seconds between two looks at a held ask's manifest, at the most

_KEY = re.compile(r"^[0-9a-f]{64}$")


def _refusal(status: int, code: str, detail: str, **extra: str) -> web.Response:
    return web.json_response({"error": code, "detail": detail, **extra}, status=status)


def _advertised(request: web.Request, coordinator: Coordinator) -> str:
    host, _, port = coordinator.advertised.rpartition(":")
    if host.strip("[]") not in ("0.0.0.0", "::"):
        return str(coordinator.advertised)
    local = request.transport.get_extra_info("sockname") if request.transport else None
    ip = str(local[0]) if local else "127.0.0.1"
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


_SWITCH = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _cluster(request: web.Request) -> bool:
    """The view's ``cluster`` parameter; ValueError saying what is wrong with the query."""
    unknown = sorted(set(request.query) - {"cluster"})
    if unknown:
        shown = ", ".join(unknown)
        raise ValueError(f"unknown parameter(s) {shown!r:.120}; the view takes cluster=0|1")
    given = request.query.getall("cluster", [])
    if len(given) > 1:
        raise ValueError("cluster= given twice; give it once: cluster=0|1")
    if not given:
        return False
    switch = _SWITCH.get(given[0].strip().lower())
    if switch is None:
        raise ValueError(f"cluster={given[0]!r:.40} is not 0 or 1: cluster=1 asks every peer too")
    return switch


def _signed(response: web.Response, proof: PeerProof | None, nonce: str | None) -> web.Response:
    """``response`` with its proof for the peer that asked with ``nonce`` (if any)."""
    if proof is not None and nonce is not None and proof.enabled:
        body = response.body if isinstance(response.body, bytes) else b""
        etag = response.headers.get("ETag", "")
        response.headers[ANSWER_HEADER] = proof.sign_answer(nonce, response.status, etag, body)
    return response


def _manifest_body(
    held: Coordinator, key: str, manifest: Manifest, swarm: str
) -> tuple[bytes, str]:
    """The encoded manifest and its ETag, kept until the manifest, address or the
    throttling answers this node got change (those go in every manifest it answers)."""
    throttled = held.throttled()
    kept = held.encoded.get(key)
    if kept is not None and kept[0] is manifest and kept[1] == (swarm, throttled):
        return kept[2], kept[3]
    body = json.dumps(manifest.as_dict(swarm, throttled), separators=(",", ":")).encode()
    etag = f'"{hashlib.sha256(body).hexdigest()[:40]}"'
    held.encoded[key] = (manifest, (swarm, throttled), body, etag)
    return body, etag


def _hold(prefer: str) -> float:
    """Seconds an unchanged manifest's answer may be held: the ``wait`` preference of a
    ``Prefer`` header (RFC 7240: delta-seconds), at most ``MAX_HOLD``; 0 without one. A
    preference not understood is ignored, as the RFC has it."""
    for preference in prefer.split(",")[:16]:
        name, _, value = preference.partition("=")
        value = value.split(";", 1)[0].strip().strip('"')
        if name.strip().lower() == "wait" and value.isascii() and value.isdigit():
            return min(float(value[:12]), MAX_HOLD)
    return 0.0


def add_swarm_routes(
    app: web.Application,
    coordinator: Callable[[], Coordinator | None],
    token: Callable[[], str | None] = lambda: None,
) -> None:
    """The two routes; ``coordinator()`` gives the daemon's (None without peers),
    ``token()`` the daemon's token (a peer's proof is checked with it)."""

    def answering(
        handler: Callable[[web.Request, Coordinator], Awaitable[web.Response]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            held = coordinator()
            proof: PeerProof = held.proof if held is not None else PeerProof(token())
            nonce = None
            header = request.headers.get(REQUEST_HEADER)
            if header is None and proof.enabled and not request.get("bearer"):
                return _refusal(401, "peer_unproven", f"no {REQUEST_HEADER} header")
            if header is not None:
                try:
                    signed = proof.check_request(header, request.method, request.path_qs)
                except ProofError as exc:
                    # A resend of a request answered already is a client's, as a rule
                    # (35-70 a cold start of 32 nodes): said, not warned of.
                    level = logging.INFO if isinstance(exc, ReplayedRequest) else logging.WARNING
                    logger.log(level, "swarm request from %s refused: %s", request.remote, exc)
                    detail = (
                        f"{exc}; peers prove they share the cluster's token (the same "
                        "AIOLOADER_TOKEN on every node, clocks in sync)"
                    )
                    return _refusal(401, "peer_unproven", detail)
                nonce = signed.nonce
                if held is not None:
                    await held.admit(signed.swarm, request.remote)
            if held is None:
                detail = "this daemon shares no models: start it with --peers"
                return _signed(_refusal(404, "no_swarm", detail), proof, nonce)
            await held.check_held()
            return _signed(await handler(request, held), proof, nonce)

        return handle

    async def node(request: web.Request, held: Coordinator) -> web.Response:
        seeding = len(held.held)
        doc = {"node": held.node, "swarm": _advertised(request, held), "seeding": seeding}
        return web.json_response(doc)

    async def model(request: web.Request, held: Coordinator) -> web.Response:
        key = request.match_info["key"]
        if not _KEY.match(key):
            detail = "a model key is 64 hex digits (sha256)"
            return _refusal(400, "bad_key", detail, node=held.node)
        loop = asyncio.get_running_loop()
        hold = _hold(request.headers.get("Prefer", "")) if held.holding < MAX_HELD else 0.0
        deadline = loop.time() + hold
        held.holding += hold > 0  # asks that may be held, not every ask in flight
        try:
            while True:
                manifest = held.manifests.get(key)
                if manifest is None:
                    swarm = _advertised(request, held)  # a peer to trade pieces with still
                    detail = "no such model here"
                    return _refusal(404, "not_held", detail, node=held.node, swarm=swarm)
                body, etag = _manifest_body(held, key, manifest, _advertised(request, held))
                if etag not in request.headers.get("If-None-Match", ""):
                    headers = {"ETag": etag}
                    return web.Response(body=body, content_type="application/json", headers=headers)
                left = deadline - loop.time()
                transport = request.transport
                if (
                    left <= 0
                    or held.manifests.released
                    or transport is None
                    or transport.is_closing()
                ):
                    return web.Response(status=304, headers={"ETag": etag})
                # A second at most between looks: the throttling answers are in the ETag
                # too, and they change without the manifests.
                await held.manifests.changed(min(_RECHECK, left))
        finally:
            held.holding -= hold > 0

    async def torrent(request: web.Request, held: Coordinator) -> web.Response:
        digest = request.match_info["hash"]
        found = held.torrent(digest) if _KEY.match(digest) else None
        if found is None:
            return _refusal(404, "not_held", "no such torrent here", node=held.node)
        return web.Response(body=found, content_type="application/x-bittorrent")

    async def view(request: web.Request, held: Coordinator) -> web.Response:
        try:
            cluster = _cluster(request)
        except ValueError as exc:
            return _refusal(400, "bad_query", str(exc))
        own = held.view(request.host[:300] or None)
        if not cluster:
            return web.json_response(ClusterView((own,)).as_dict())
        if REQUEST_HEADER in request.headers:
            detail = "a peer is answered for this node only; ask without cluster="
            return _refusal(400, "bad_query", detail)
        return web.json_response((await held.cluster(own, held.wait)).as_dict())

    app.router.add_get("/v1/swarm/node", answering(node))
    app.router.add_get("/v1/swarm/view", answering(view))
    app.router.add_get("/v1/swarm/torrents/{hash}", answering(torrent))
    app.router.add_get("/v1/swarm/models/{key}", answering(model))
