"""The daemon's HTTP API: request handling only, no life cycle.

Routes::

    GET    /health             200 while the process lives (liveness, startup probe)
    GET    /ready[?model=X]    200 when every preload (or X) is in the cache, else 503
                               naming each missing one: why, and when its next try is;
                               models added through the API show under "pending"
                               but never hold the node's readiness (see state.py)
    GET    /metrics            Prometheus text
    GET    /v1/models          every model with its status and progress
    POST   /v1/models          {"url": ..., "id": optional, "priority": optional}
                               -> 202, download starts (higher priorities first)
    GET    /v1/models/{id}     one model
    GET    /v1/models/{id}/files/{key}
                               the bytes of one file of a ready model, by its cache
                               entry's name (``aioloader fetch --daemon`` reads them)
    DELETE /v1/models/{id}     cancel its download, drop it from the registry and cache
    GET    /v1/swarm/...       what peer daemons ask, and the cluster's view
                               (swarm/answering.py)

With a token configured, /v1/* requires ``Authorization: Bearer <token>``, but for
the swarm's routes, which peers ask with a proof instead (swarm/answering.py);
/health, /ready and /metrics stay open, since kubelet probes and most scrapers
send no credentials and none of the three shows a secret: every URL is shown
with its user info and query values redacted. The probes answer from memory
(the registry, kept current by ``watch.py``): they never read the cache.
Every error is JSON: ``{"error": <code>, "detail": <what to do>}``, a bad body
included (400: not JSON, nested too deep, not an object; 413: too large; 408: not
sent within ``--client-timeout``). A URL holding whitespace or a control character
is refused (400), so that none reaches a log line or a request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

from ..cache.entry import key_of
from ..errors import CacheError, ClosedError, ConfigError, LoaderError
from ..redact import redacting_logger
from ..sources.auto import scheme_of
from ..sources.schemes import listed, remote_names
from ..sources.stores import Location, locate
from ..swarm.answering import add_swarm_routes
from ..swarm.proof import REQUEST_HEADER
from .allow import AllowList
from .downloads import Downloads
from .files import file_answer
from .metrics import CONTENT_TYPE, Metrics
from .priority import check_priority
from .state import ID_PATTERN, ModelRecord, Registry, display_url
from .watch import CacheWatch

if TYPE_CHECKING:
    from aiohttp.typedefs import Middleware

    from ..cache import ModelCache

__all__ = ["DaemonState", "RequestError", "check_url", "make_app"]

logger = redacting_logger(__name__)

_FIELDS = {"url", "id", "priority"}
_SHAPE = '{"url": "...", "id": "optional", "priority": 0}'
_MAX_URL = 4096
MAX_BODY = 64 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class DaemonState:
    """What the handlers share; built and torn down by ``server.py``."""

    cache: ModelCache
    registry: Registry
    downloads: Downloads
    metrics: Metrics
    watch: CacheWatch
    token: str | None = None
    allow: AllowList = field(default_factory=AllowList)
    client_timeout: float = 10.0  # seconds to send a request's body
    stopping: bool = False
    coordinator: Any = None  # with --peers: aioloader/swarm/coordinator.py


STATE = web.AppKey("state", DaemonState)


class RequestError(Exception):
    """An API request that cannot be served, as (status, code, detail)."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra

    def response(self) -> web.Response:
        body = {"error": self.code, "detail": self.detail, **self.extra}
        return web.json_response(body, status=self.status)


def check_url(url: object, allow: AllowList | None = None) -> Location:
    """``url``, parsed once, if the daemon may fetch it (``allow``: None or empty, any
    remote URL): the ``Location`` the allow-list judged, which the fetch then reads.

    Raises:
        RequestError: 400 when it is not a remote model URL, 403 when outside the allow-list.
    """
    if not isinstance(url, str) or not url.strip():
        raise RequestError(400, "missing_url", 'give the model as {"url": "s3://bucket/model/"}')
    url = url.strip()
    if len(url) > _MAX_URL:
        raise RequestError(400, "bad_url", f"the URL is longer than {_MAX_URL} characters")
    bad = next((i for i, c in enumerate(url) if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise RequestError(
            400,
            "bad_url",
            f"the URL holds whitespace or a control character ({url[bad]!r} at position "
            f"{bad}); percent-encode it (a newline is %0A, a space %20)",
        )
    try:
        where: Location | None = locate(url)
    except ConfigError as exc:  # a scheme no backend reads, a malformed hf:// URL ...
        where, malformed = None, exc
    try:
        scheme = scheme_of(url) if where is None else where.scheme.name
    except ConfigError as exc:  # not even a scheme to read: an unbalanced "[" in the host
        raise RequestError(400, "bad_url", str(exc)) from None
    if scheme not in remote_names():
        raise RequestError(
            400,
            "unsupported_scheme",
            f"URL scheme {scheme!r} is not supported: the daemon caches remote models "
            f"({listed(remote=True)}); local paths and file:// URLs are already on the node",
        )
    try:
        netloc = urlsplit(url).netloc
    except ValueError as exc:  # an unbalanced "[" in the host, say
        raise RequestError(400, "bad_url", f"{display_url(url)}: {exc}") from None
    if not netloc:
        raise RequestError(400, "bad_url", f"{display_url(url)}: the URL names no host or bucket")
    if where is None:
        raise RequestError(400, "bad_url", str(malformed))
    reason = allow.refusal(where) if allow is not None else None
    if reason is not None:
        raise RequestError(
            403,
            "url_not_allowed",
            f"{display_url(url)} may not be fetched: {reason}; ask the operator to add its "
            "prefix to --allow-prefix / AIOLOADER_ALLOW_PREFIXES",
        )
    return where


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal as JSON, counted in the metrics."""
    metrics = request.app[STATE].metrics
    try:
        return await handler(request)
    except RequestError as exc:
        metrics.rejected.labels(status=str(exc.status)).inc()
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        metrics.rejected.labels(status=str(exc.status)).inc()
        return web.json_response(
            {"error": exc.reason.lower().replace(" ", "_"), "detail": exc.text or exc.reason},
            status=exc.status,
            headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"},
        )
    except LoaderError as exc:
        # The cache could not list or remove entries (disk gone, permissions changed).
        metrics.rejected.labels(status="500").inc()
        logger.warning("%s %s failed: %s", request.method, request.path, exc)
        return web.json_response({"error": type(exc).__name__, "detail": str(exc)}, status=500)
    except Exception:
        # A bug: the traceback goes to the log, never to the client.
        metrics.rejected.labels(status="500").inc()
        logger.exception("%s %s failed", request.method, request.path)
        return web.json_response(
            {"error": "internal_error", "detail": "the daemon failed; its log says why"},
            status=500,
        )


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[STATE].token
    if request.path.startswith("/v1/swarm/") and REQUEST_HEADER in request.headers:
        return await handler(request)  # a peer's proof, checked by the route (swarm/answering.py)
    if token and request.path.startswith("/v1/"):
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), token.encode()
        ):
            raise RequestError(
                401,
                "unauthorized",
                "send the daemon's token as 'Authorization: Bearer <token>'",
            )
        request["bearer"] = True
    return await handler(request)


def _find(state: DaemonState, key: str) -> ModelRecord:
    record = state.registry.find(key)
    if record is None:
        raise RequestError(404, "unknown_model", f"no model {key!r}; GET /v1/models lists them")
    return record


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"status": "stopping" if state.stopping else "ok"})


async def ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = request.query.get("model")
    records = [_find(state, key)] if key is not None else None
    ok, body = state.registry.readiness(records)
    if state.stopping:
        ok, body["ready"], body["reason"] = False, False, "shutting down"
    return web.json_response(body, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    counts: dict[str, int] = {}
    for record in state.registry.all():
        counts[record.status] = counts.get(record.status, 0) + 1
    state.metrics.set_statuses(counts)
    return web.Response(body=state.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"models": [r.as_dict() for r in state.registry.all()]})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response(_find(state, request.match_info["id"]).as_dict())


async def model_file(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    record = _find(state, request.match_info["id"])
    key = request.match_info["key"]
    url = next((u for u in record.files if key_of(u) == key), None)
    if record.status != "ready" or url is None:
        raise RequestError(
            404, "unknown_file", f"{record.id} is {record.status} and holds no file {key!r:.80}"
        )
    return await file_answer(state.cache, url)  # 404 once evicted


async def _body(request: web.Request) -> dict[str, Any]:
    timeout = request.app[STATE].client_timeout
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise RequestError(
            408,
            "body_timeout",
            f"the body did not arrive within {timeout:g} s (--client-timeout); send it whole",
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(
            413,
            "body_too_large",
            f"the body is larger than {MAX_BODY // 1024} KiB; a request is " + _SHAPE,
        ) from None
    if not raw.strip():
        raise RequestError(400, "bad_json", 'the body is empty; send {"url": "..."}')
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError(
            400,
            "too_deep",
            "the body nests arrays or objects too deeply; a request is a flat object: " + _SHAPE,
        ) from None
    if not isinstance(body, dict):
        raise RequestError(400, "bad_json", 'the body must be a JSON object: {"url": "..."}')
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise RequestError(
            400,
            "unknown_fields",
            f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(_FIELDS))}",
            fields=unknown,
        )
    return body


async def add_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await _body(request)
    where = check_url(body.get("url"), state.allow)
    url = where.first
    model_id = body.get("id")
    if model_id is not None and (not isinstance(model_id, str) or not ID_PATTERN.match(model_id)):
        raise RequestError(
            400, "bad_id", "an id is 1-64 letters, digits, '.', '_' or '-', starting alphanumeric"
        )
    priority = body.get("priority")
    if priority is not None:
        try:
            priority = check_priority(priority)
        except ConfigError as exc:
            raise RequestError(400, "bad_priority", str(exc)) from None
    if state.stopping or not state.downloads.accepting:
        raise RequestError(503, "shutting_down", "the daemon is shutting down; try another node")
    existing = state.registry.find(url)
    if existing is not None and model_id is not None and existing.id != model_id:
        raise RequestError(
            409, "conflict", f"this URL is already held as {existing.id!r}", id=existing.id
        )
    try:
        record = state.registry.add(where, model_id)
    except KeyError:
        raise RequestError(
            409, "conflict", f"the id {model_id!r} already names another URL; pick another id"
        ) from None
    if priority is not None:
        record.priority = priority  # a queued download's place in line follows at once
    try:
        started = state.downloads.submit(record)
    except ClosedError:
        raise RequestError(503, "shutting_down", "the daemon is shutting down") from None
    status = 202 if started or existing is None else 200
    return web.json_response(record.as_dict(), status=status)


async def delete_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    record = _find(state, request.match_info["id"])
    await state.downloads.cancel(record.id)
    state.registry.drop(record.id)
    try:
        for url in record.files or (record.url,):
            await state.cache.remove(url)
    except CacheError as exc:
        raise RequestError(
            409, "in_use", f"dropped from the registry, but its files stay cached: {exc}"
        ) from None
    finally:
        await state.watch.refresh()  # another model may have shared a file
    logger.info("dropped %s (%s)", display_url(record.url), record.id)
    return web.json_response({"id": record.id, "deleted": True})


def make_app(state: DaemonState, *outer: Middleware) -> web.Application:
    """The aiohttp application serving ``state``; ``outer`` middlewares run first (the
    connection guard's, connections.py)."""
    app = web.Application(middlewares=[*outer, _errors, _auth], client_max_size=MAX_BODY)
    app[STATE] = state
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/models", add_model)
    app.router.add_get("/v1/models/{id}", get_model)
    app.router.add_delete("/v1/models/{id}", delete_model)
    app.router.add_get("/v1/models/{id}/files/{key}", model_file)
    add_swarm_routes(app, lambda: state.coordinator, lambda: state.token)
    return app
