"""Settings of ``aioloader serve``, from the command line or the environment.

The flags are the rows of ``settings.DAEMON``; each row's text (the flag's, else its
variable's) is checked and converted here, naming where it came from.

Pure and cheap to import: ``aioloader --help`` reads the arguments from here
without pulling in aiohttp or prometheus-client.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..settings.resolver import resolve_where, warn_unknown_variables
from ..settings.table import DAEMON
from ..settings.values import MAX_SECONDS, check_number, parse_size
from ..swarm.manifest import MAX_ORIGIN_REQUESTS
from ..swarm.peers import parse_peers
from .allow import AllowList
from .auth import check_open, read_token, token_text
from .bandwidth import check_bandwidth
from .priority import check_priority
from .retry import DEFAULT_RETRY_BACKOFF, DEFAULT_RETRY_BACKOFF_MAX, Backoff

__all__ = [
    "DaemonConfig",
    "DAEMON",
    "add_arguments",
    "config_from_args",
    "default_cache_dir",
    "parse_bandwidth",
    "parse_preload",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8790
# Kubernetes waits 30 s (terminationGracePeriodSeconds) before SIGKILL; stay under it.
DEFAULT_GRACE_PERIOD = 25.0
DEFAULT_MAX_DOWNLOADS = 2
# Client connections held at once (probes, scrapers and a node's pods); see connections.py.
DEFAULT_MAX_CONNECTIONS = 1000
# Seconds a client has to send a request's headers, and again its body.
DEFAULT_CLIENT_TIMEOUT = 10.0
DEFAULT_SWARM_PORT = 6881
DEFAULT_SWARM_WAIT = 2.0
DEFAULT_SWARM_STALL = 30.0
DEFAULT_SWARM_ORIGIN_REQUESTS = 64
MAX_SWARM_RATE = (1 << 31) - 1  # bytes per second: libtorrent's rates are 32-bit


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/aioloader``, else ``~/.cache/aioloader``."""
    home = environ.get("HOME") or str(Path.home())
    return Path(environ.get("XDG_CACHE_HOME") or Path(home) / ".cache") / "aioloader"


@dataclass(frozen=True)
class DaemonConfig:
    """Everything the daemon needs to start.

    Attributes:
        host, port: where it listens (127.0.0.1 unless told otherwise).
        cache_dir: the node-local cache it fills.
        max_cache_bytes: the cache's size limit (None: no limit).
        models: URLs to preload at startup and keep in the cache.
        priorities: (URL, priority) of the preloads whose priority is not 0.
        token: the bearer token /v1/* requests must carry (None: no check; see auth.py),
            from ``--token``, its variable or the token file.
        no_auth: ``--no-auth``: no token, on purpose (the log then says so more quietly).
            Without a token, only a loopback ``host`` is accepted (``auth.check_open``).
        allow_prefixes: URLs must lie under one of these, compared as parsed URLs
            segment by segment (empty: any URL); see allow.py.
        concurrency: reads in flight per download (None: the cache's default).
        max_downloads: models downloading at once; the rest wait as ``queued``
            and start highest priority first.
        max_bandwidth: bytes per second all downloads share (0: no cap).
        grace_period: seconds from SIGTERM to exit.
        max_connections: client connections held at once; a new one past it closes
            the longest idle one (see connections.py).
        client_timeout: seconds a client has to send a request's headers (from its
            connection, or its previous answer), and again to send its body.
        retry_backoff: seconds before a failed preload is tried again; doubles
            after each failure in a row (with jitter), up to ``retry_backoff_max``.
        peers: the peer daemons' API addresses (``host:port``), with which models are
            shared over BitTorrent (empty: no swarm; see docs/swarm.md).
        swarm_port, swarm_host: where the swarm listens (None: ``host``).
        swarm_wait: seconds a download waits for its peers' answers.
        swarm_stall: seconds without swarm progress before a file turns to the origin.
        swarm_rate: bytes per second the swarm sends at most, and takes (0: no cap).
        swarm_origin_requests: requests in flight to one origin, cluster-wide, shared
            out among the nodes that pull (0: no cap; docs/swarm.md).
        notes: warnings from reading the settings, for the log (never a secret).
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    cache_dir: Path = Path(".")
    max_cache_bytes: int | None = None
    models: tuple[str, ...] = ()
    priorities: tuple[tuple[str, int], ...] = ()
    token: str | None = None
    allow_prefixes: tuple[str, ...] = ()
    concurrency: int | None = None
    max_downloads: int = DEFAULT_MAX_DOWNLOADS
    max_bandwidth: int = 0
    grace_period: float = DEFAULT_GRACE_PERIOD
    retry_backoff: float = DEFAULT_RETRY_BACKOFF
    retry_backoff_max: float = DEFAULT_RETRY_BACKOFF_MAX
    no_auth: bool = False
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    client_timeout: float = DEFAULT_CLIENT_TIMEOUT
    peers: tuple[str, ...] = ()
    swarm_port: int = DEFAULT_SWARM_PORT
    swarm_wait: float = DEFAULT_SWARM_WAIT
    swarm_stall: float = DEFAULT_SWARM_STALL
    swarm_rate: int = 0
    swarm_origin_requests: int = DEFAULT_SWARM_ORIGIN_REQUESTS
    swarm_host: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_number("port", self.port, integer=True, maximum=65535)
        if self.concurrency is not None:
            check_number("concurrency", self.concurrency, integer=True, positive=True)
        check_number("max downloads", self.max_downloads, integer=True, positive=True)
        check_bandwidth(self.max_bandwidth, "max bandwidth (--max-bandwidth)")
        for url, priority in self.priorities:
            check_priority(priority, f"the priority of {url}")
        check_number("grace period", self.grace_period, maximum=MAX_SECONDS)
        check_number("max connections", self.max_connections, integer=True, positive=True)
        check_number("client timeout", self.client_timeout, positive=True, maximum=MAX_SECONDS)
        check_open(self.host, self.token, self.no_auth)
        check_number(_shown("swarm_port"), self.swarm_port, integer=True, maximum=65535)
        check_number(_shown("swarm_wait"), self.swarm_wait, positive=True, maximum=MAX_SECONDS)
        check_number(_shown("swarm_stall"), self.swarm_stall, positive=True, maximum=MAX_SECONDS)
        check_bandwidth(self.swarm_rate, _shown("swarm_rate"))
        if self.swarm_rate > MAX_SWARM_RATE:  # libtorrent keeps rates in 32 bits
            raise ConfigError(
                f"{_shown('swarm_rate')} must be at most 2GiB/s, got {self.swarm_rate} bytes "
                "per second; use 0 for no cap"
            )
        check_number(
            _shown("swarm_origin_requests"),
            self.swarm_origin_requests,
            integer=True,
            maximum=MAX_ORIGIN_REQUESTS,
        )
        parse_peers(self.peers, "peers")
        if self.max_cache_bytes is not None:
            check_number("max cache bytes", self.max_cache_bytes, integer=True, positive=True)
        Backoff(self.retry_backoff, self.retry_backoff_max)  # raises ConfigError if unusable
        AllowList(self.allow_prefixes)  # raises ConfigError for a prefix it cannot use

    @property
    def backoff(self) -> Backoff:
        """The delays between the tries of a failed preload."""
        return Backoff(self.retry_backoff, self.retry_backoff_max)

    def __repr__(self) -> str:
        # The token never reaches a log line.
        token = "set" if self.token else "none"
        return (
            f"DaemonConfig(host={self.host!r}, port={self.port}, "
            f"cache_dir={str(self.cache_dir)!r}, "
            f"max_cache_bytes={self.max_cache_bytes}, models={len(self.models)}, token={token}, "
            f"allow_prefixes={self.allow_prefixes}, concurrency={self.concurrency}, "
            f"max_downloads={self.max_downloads}, max_bandwidth={self.max_bandwidth}, "
            f"priorities={len(self.priorities)}, grace_period={self.grace_period}, "
            f"retry_backoff={self.retry_backoff}, retry_backoff_max={self.retry_backoff_max}, "
            f"max_connections={self.max_connections}, client_timeout={self.client_timeout}, "
            f"peers={len(self.peers)}, swarm_port={self.swarm_port})"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``aioloader serve``, one per row of ``settings.DAEMON``; each also
    reads its environment variable, named in brackets."""
    for row in DAEMON:
        variable = row.variable
        if row.action == "append":
            variable += ", comma-separated"
        elif row.action == "store_true":
            variable += "=1"
        extra: dict[str, Any] = {"action": row.action} if row.action else {}
        if row.action == "store_true":
            extra["default"] = None  # not given: the variable decides
        if row.action == "append":
            extra["metavar"] = "URL" if row.name == "models" else "PREFIX"
        parser.add_argument(row.flag, help=f"{row.help} [{variable}]", dest=row.dest, **extra)


# A row's types say which of its texts are numbers, and which kind.
_NUMBERS: dict[tuple[type, ...], type[int] | type[float]] = {(int,): int, (int, float): float}


def _shown(name: str) -> str:
    """A swarm setting as its errors name it: with its flag and its variable."""
    return f"{name.replace('_', ' ')} (--{name.replace('_', '-')} / AIOLOADER_{name.upper()})"


def _number(value: str | None, kind: type[int] | type[float], what: str) -> int | float | None:
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{what} must be a number, got {value!r}") from None


def parse_bandwidth(value: str, what: str) -> int:
    """``500MB/s``, ``2GiB/s``, ``1048576``: bytes per second (``/s`` may be left out).

    Raises:
        ConfigError: naming ``what``: not a size, or outside the bounds of bandwidth.py.
    """
    text = value.strip()
    if text.lower().endswith("/s"):
        text = text[:-2]
    return check_bandwidth(parse_size(text, what=what), what)


def parse_preload(value: str, what: str) -> tuple[str, int]:
    """``URL`` or ``URL priority=N`` (a URL holds no space) as (URL, priority).

    Raises:
        ConfigError: naming ``what`` and the URL: an unknown key, or a priority that
            is not an integer or is out of range.
    """
    url, *rest = value.split()
    what = f"{what} {url!r:.80}"
    priority = 0
    for item in rest:
        key, sep, number = item.partition("=")
        if key != "priority" or not sep:
            raise ConfigError(
                f"{what}: cannot read {item!r:.40} after the URL; write 'URL priority=N'"
            )
        try:
            priority = int(number)
        except ValueError:
            raise ConfigError(f"{what}: priority must be an integer, got {number!r:.40}") from None
        check_priority(priority, f"{what}: priority")
    return url, priority


def _flag(value: str | None, what: str) -> bool:
    text = (value or "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{what} must be 1 or 0 (true or false), got {value!r:.40}")


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> DaemonConfig:
    """A DaemonConfig: each flag, else its environment variable, else the default
    (``environ``: ``None`` for this process's).

    Raises:
        ConfigError: a value cannot be read; naming the flag or the variable.
    """
    warn_unknown_variables(environ)  # a misspelt variable is said at startup
    text: dict[str, Any] = {}
    where: dict[str, str] = {}
    for row in DAEMON:
        value, source = resolve_where(row, getattr(args, row.dest, None), environ)
        text[row.name], where[row.name] = value, source or row.flag
    preloads: dict[str, int] = {}
    for item in text["models"] or ():
        if item.strip():
            url, priority = parse_preload(item, where["models"])
            preloads.setdefault(url, priority)  # a URL given twice keeps its first entry
    no_auth = text["no_auth"] is True or _flag(text["no_auth"], where["no_auth"])
    raw, given = token_text(
        text["token"], where["token"], text["token_file"], where["token_file"], no_auth=no_auth
    )
    token = read_token(raw, given, no_auth=no_auth)
    bandwidth, max_bytes = text["max_bandwidth"], text["max_cache_bytes"]
    home = os.environ if environ is None else environ
    numbers = {
        row.name: _number(
            text[row.name],
            kind,
            _shown(row.name) if row.name.startswith("swarm_") else row.name.replace("_", " "),
        )
        for row in DAEMON
        if (kind := _NUMBERS.get(row.types))
    }
    return DaemonConfig(
        host=text["host"] or DEFAULT_HOST,
        port=_or(numbers["port"], DEFAULT_PORT),
        cache_dir=Path(text["cache_dir"]) if text["cache_dir"] else default_cache_dir(home),
        max_cache_bytes=parse_size(max_bytes, what="max cache bytes") if max_bytes else None,
        models=tuple(preloads),
        priorities=tuple((url, p) for url, p in preloads.items() if p),
        token=token.value,
        no_auth=no_auth,
        notes=token.notes,
        allow_prefixes=tuple(text["allow_prefixes"] or ()),
        concurrency=_or(numbers["concurrency"], None),
        max_downloads=_or(numbers["max_downloads"], DEFAULT_MAX_DOWNLOADS),
        max_bandwidth=parse_bandwidth(bandwidth, where["max_bandwidth"]) if bandwidth else 0,
        grace_period=_or(numbers["grace_period"], DEFAULT_GRACE_PERIOD),
        retry_backoff=_or(numbers["retry_backoff"], DEFAULT_RETRY_BACKOFF),
        retry_backoff_max=_or(numbers["retry_backoff_max"], DEFAULT_RETRY_BACKOFF_MAX),
        max_connections=_or(numbers["max_connections"], DEFAULT_MAX_CONNECTIONS),
        client_timeout=_or(numbers["client_timeout"], DEFAULT_CLIENT_TIMEOUT),
        peers=tuple(str(p) for p in parse_peers(text["peers"], where["peers"])),
        swarm_port=_or(numbers["swarm_port"], DEFAULT_SWARM_PORT),
        swarm_wait=_or(numbers["swarm_wait"], DEFAULT_SWARM_WAIT),
        swarm_stall=_or(numbers["swarm_stall"], DEFAULT_SWARM_STALL),
        swarm_rate=parse_bandwidth(rate, where["swarm_rate"])
        if (rate := text["swarm_rate"])
        else 0,
        swarm_origin_requests=_or(numbers["swarm_origin_requests"], DEFAULT_SWARM_ORIGIN_REQUESTS),
        swarm_host=text["swarm_host"] or None,
    )


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
