"""The life cycle of ``aioloader serve`` (after uvicorn's ``server.py``).

Startup: check that the cache folder is writable (else exit 2), listen, then
queue the preloads, so /health answers at once and /ready turns 200 when they
are cached. A model that fails (a preload, or one added through the API) is tried
again with capped exponential backoff (``--retry-backoff``, ``--retry-backoff-max``)
until it is cached or deleted; /ready names it meanwhile, with the error and the
time of the next try. A cached preload is held against eviction (pins.py).
Shutdown, on SIGTERM or SIGINT: /ready answers 503 and new work is
refused, the listener closes, downloads are cancelled (the cache keeps their
bytes under temporary names, so a restart resumes them and no partial file
ever shows under a final name), and the process exits 0, all within the grace
period. A second signal stops waiting and exits 1.

Connections: the listener hands each one to a ``ConnectionGuard``
(connections.py), which holds at most ``--max-connections`` and closes those
that do not deliver a request within ``--client-timeout``, so that the probes
are answered whatever other clients do. ``aioloader serve`` first lifts the
open-file limit to its hard limit.

Signal handlers are installed here only, and only from the main thread. While
it serves, the redacting log filter also sits on the root logger's handlers, so
that no record of any logger (aiohttp's included) prints a URL's secrets, and
after it one that escapes control characters (logs.py), so that no text a
client sent can forge a line of the log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LoaderError, StartupError
from ..redact import RedactingFilter, redacting_logger
from ..runtime.threads import Lane, run_blocking
from .config import DaemonConfig, config_from_args
from .logs import EscapingFilter

if TYPE_CHECKING:
    from aiohttp import web

    from .connections import ConnectionGuard

__all__ = ["EXIT_STARTUP", "Server", "serve_from_args"]

logger = redacting_logger(__name__)

EXIT_STARTUP = 2
"""Exit status when the daemon could not start (bad setting, cache not writable, port taken)."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Connections waiting to be accepted. Probes, scrapers and pods of a whole node can
# arrive at once, and a connection beyond the backlog waits a second (a SYN resend).
_BACKLOG = 1024


def _check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and write a file there, or raise StartupError."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".aioloader-write-check-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise StartupError(
            f"cache directory {folder} is not writable ({exc.strerror or exc}); mount a "
            "writable volume there or pass --cache-dir / AIOLOADER_CACHE_DIR"
        ) from exc


class Server:
    """One daemon: its cache, registry, downloads and HTTP listener.

    Use ``await Server(config).serve()``; it returns the exit status.
    """

    def __init__(self, config: DaemonConfig, *, swarm: bool = False) -> None:
        """``swarm``: start the swarm even without ``config.peers``, for a program that
        embeds the daemon and gives it its peers once it knows them (``set_peers``;
        aioloader/ray/preload.py)."""
        self.config = config
        self.port: int | None = None
        self.swarm = swarm
        # Set once it listens (``listening``): the cache, and the swarm's Coordinator
        # (None without one).
        self.cache: Any = None
        self.coordinator: Any = None
        self.listening = asyncio.Event()
        self.error: str | None = None  # why it did not start (``serve`` returned 2)
        self._exit = asyncio.Event()
        self._signals = 0
        self._main: asyncio.Task[Any] | None = None

    def __repr__(self) -> str:
        return f"<Server {self.config.host}:{self.port} exiting={self._exit.is_set()}>"

    def request_exit(self, sig: int | None = None) -> None:
        """Begin a graceful shutdown; a second request forces the exit."""
        self._signals += 1
        name = signal.Signals(sig).name if sig else "request"
        if self._signals == 1:
            logger.info("%s received; shutting down (grace %.0f s)", name, self.config.grace_period)
            self._exit.set()
        elif self._main is not None:
            logger.warning("%s received again; exiting now", name)
            self._main.cancel()

    @contextlib.contextmanager
    def _capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # the embedding program owns signals then
            return
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self.request_exit, sig)
        try:
            yield
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)

    def set_peers(self, peers: list[str]) -> None:
        """The running daemon's peers (``host:port`` of their API), in place of those it
        had: its next fetch asks these.

        Raises:
            ConfigError: an entry is not ``host:port``, or the daemon has no swarm.
        """
        from ..swarm.peers import parse_peers

        if self.coordinator is None:
            raise ConfigError("this daemon has no swarm: start it with peers, or swarm=True")
        self.coordinator.set_peers(parse_peers(peers, "peers"))

    async def serve(self) -> int:
        """Run until a signal (or ``request_exit``); returns the exit status."""
        self._main = asyncio.current_task()
        with self._capture_signals(), _redacted_handlers():
            try:
                return await self._serve()
            except (StartupError, ConfigError) as exc:
                self.error = str(exc)
                print(f"aioloader serve: error: {exc}", file=sys.stderr)
                return EXIT_STARTUP
            except asyncio.CancelledError:
                if self._signals > 1:
                    return 1
                raise

    async def _serve(self) -> int:
        from aiohttp import web

        from .allow import AllowList
        from .app import DaemonState, RequestError, check_url, make_app
        from .bandwidth import Bandwidth
        from .connections import ConnectionGuard, fit_cap
        from .downloads import Downloads
        from .metrics import Metrics
        from .pins import Pins
        from .sharing import sharing
        from .state import Registry, display_url
        from .watch import CacheWatch

        config = self.config
        for note in config.notes:
            logger.warning("%s", note)
        if config.token is None:
            logger.log(
                logging.INFO if config.no_auth else logging.WARNING,
                "no token%s: /v1/* accepts any client that reaches %s:%s%s",
                " (--no-auth)" if config.no_auth else "",
                config.host,
                config.port,
                ""
                if config.no_auth
                else "; set AIOLOADER_TOKEN (`openssl rand -hex 32`), "
                "or pass --no-auth to say this is intended",
            )
        allow = AllowList(config.allow_prefixes)
        checked = {}  # each preload's Location, as the allow-list judged it
        for url in config.models:
            try:
                checked[url] = check_url(url, allow)
            except RequestError as exc:
                raise StartupError(f"preload model {display_url(url)!r}: {exc.detail}") from None
        with Lane("startup", 1) as lane:
            await run_blocking(lane, lambda: _check_writable(config.cache_dir))
        cache = _open_cache(config)
        bandwidth = Bandwidth(config.max_bandwidth) if config.max_bandwidth else None
        metrics = Metrics(getattr(cache, "statistics", None), bandwidth)
        registry = Registry()
        async with (
            sharing(config, cache.root, always=self.swarm) as coordinator,
            Pins(cache) as pins,
            CacheWatch(cache, registry, metrics) as watch,
            Downloads(
                cache,
                registry,
                metrics,
                concurrency=config.concurrency,
                max_downloads=config.max_downloads,
                allow=allow,
                after_fetch=watch.refresh,
                backoff=config.backoff,
                bandwidth=bandwidth,
                pins=pins,
                coordinator=coordinator,
            ) as downloads,
        ):
            watch.on_evicted = downloads.refetch
            if coordinator is not None:
                metrics.swarm_banned = lambda: float(coordinator.swarm.statistics().banned)
            state = DaemonState(
                cache=cache,
                registry=registry,
                downloads=downloads,
                metrics=metrics,
                watch=watch,
                token=config.token,
                allow=allow,
                client_timeout=config.client_timeout,
                coordinator=coordinator,
            )
            guard = ConnectionGuard(
                fit_cap(config.max_connections, _open_files()), config.client_timeout
            )
            runner = web.AppRunner(
                make_app(state, guard.middleware),
                access_log=None,
                handle_signals=False,
                shutdown_timeout=max(0.1, min(5.0, config.grace_period / 2)),
            )
            await runner.setup()
            listener: asyncio.Server | None = None
            try:
                listener = await _listen(config, runner, guard)
                sockets = listener.sockets
                self.port = sockets[0].getsockname()[1] if sockets else config.port
                logger.info("listening on http://%s:%s (%r)", config.host, self.port, config)
                self.cache, self.coordinator = cache, coordinator
                self.listening.set()
                priorities = dict(config.priorities)
                preloads = [
                    registry.add(checked[url], preload=True, priority=priorities.get(url, 0))
                    for url in config.models
                ]
                # Submitted highest first, so the first free slots go to them too.
                for record in sorted(preloads, key=lambda r: -r.priority):
                    downloads.submit(record)
                await self._exit.wait()
                state.stopping = True
                if coordinator is not None:  # the peers' held asks are answered now
                    coordinator.manifests.release()
                downloads.close()
                deadline = asyncio.get_running_loop().time() + config.grace_period
            finally:
                if listener is not None:
                    listener.close()
                await runner.cleanup()
                guard.close_all()
            left = await downloads.stop(deadline - asyncio.get_running_loop().time())
            if left:
                logger.warning("downloads still stopping after the grace period: %s", left)
        logger.info("stopped")
        return 0


async def _listen(config: DaemonConfig, runner: web.AppRunner, guard: ConnectionGuard) -> Any:
    """The listening socket, each connection held by ``guard``.

    Raises:
        StartupError: the address cannot be listened on.
    """
    assert runner.server is not None
    try:
        return await asyncio.get_running_loop().create_server(
            guard.protocols(runner.server), config.host, config.port, backlog=_BACKLOG
        )
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}; "
            "pick another --port / AIOLOADER_PORT"
        ) from exc


@contextlib.contextmanager
def _redacted_handlers() -> Iterator[None]:
    """The redacting, then the escaping filter on the root logger's handlers while the
    daemon serves."""
    handlers = list(logging.getLogger().handlers)
    filters = (RedactingFilter(), EscapingFilter())
    for handler in handlers:
        for log_filter in filters:
            handler.addFilter(log_filter)
    try:
        yield
    finally:
        for handler in handlers:
            for log_filter in filters:
                handler.removeFilter(log_filter)


def _open_files() -> int | None:
    """The soft limit of open files, or None where there is none."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux or macOS
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def _open_cache(config: DaemonConfig) -> Any:
    try:
        from ..cache import ModelCache
    except ImportError as exc:  # pragma: no cover - the cache ships with the package
        raise StartupError(f"the model cache is not available: {exc}") from exc
    try:
        return ModelCache(config.cache_dir, max_bytes=config.max_cache_bytes)
    except LoaderError as exc:  # CacheError: the folder cannot hold a cache
        raise StartupError(str(exc)) from exc


async def serve_from_args(args: argparse.Namespace) -> int:
    """Entry point of ``aioloader serve``; returns the exit status."""
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"aioloader serve: error: {exc}", file=sys.stderr)
        return EXIT_STARTUP
    from .connections import raise_open_files_limit

    raise_open_files_limit()  # the process's own: an embedded Server leaves it alone
    return await Server(config).serve()
