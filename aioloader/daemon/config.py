"""Settings of ``aioloader serve``, from the command line or the environment.

Pure and cheap to import: ``aioloader --help`` reads the arguments from here
without pulling in aiohttp or prometheus-client.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import MAX_SECONDS, check_number, parse_size
from ..environment import warn_unknown_variables
from ..errors import ConfigError
from .allow import AllowList
from .auth import read_token
from .bandwidth import check_bandwidth
from .priority import check_priority
from .retry import DEFAULT_RETRY_BACKOFF, DEFAULT_RETRY_BACKOFF_MAX, Backoff

__all__ = [
    "DaemonConfig",
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
        token: the bearer token /v1/* requests must carry (None: no check; see auth.py).
        no_auth: ``--no-auth``: no token, on purpose (the log then says so more quietly).
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
            f"max_connections={self.max_connections}, client_timeout={self.client_timeout})"
        )


# (flag, environment variable, help)
_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("--host", "AIOLOADER_HOST", f"address to listen on (default {DEFAULT_HOST})"),
    ("--port", "AIOLOADER_PORT", f"port to listen on (default {DEFAULT_PORT})"),
    ("--cache-dir", "AIOLOADER_CACHE_DIR", "cache folder (default ~/.cache/aioloader)"),
    ("--max-cache-bytes", "AIOLOADER_MAX_CACHE_BYTES", "cache size limit, e.g. 200GiB"),
    (
        "--token",
        "AIOLOADER_TOKEN",
        "bearer token required on /v1/*, 16 characters or more, e.g. from `openssl rand -hex "
        "32` (prefer the env var; surrounding whitespace is stripped)",
    ),
    ("--concurrency", "AIOLOADER_CONCURRENCY", "reads in flight per download"),
    (
        "--max-downloads",
        "AIOLOADER_MAX_DOWNLOADS",
        "models downloading at once, highest priority first (default 2)",
    ),
    (
        "--max-bandwidth",
        "AIOLOADER_MAX_BANDWIDTH",
        "bytes per second all downloads share, e.g. 500MB/s (default 0: no cap)",
    ),
    ("--grace-period", "AIOLOADER_GRACE_PERIOD", "seconds from SIGTERM to exit (default 25)"),
    (
        "--retry-backoff",
        "AIOLOADER_RETRY_BACKOFF",
        f"seconds before a failed preload is tried again; doubles per failure "
        f"(default {DEFAULT_RETRY_BACKOFF:g})",
    ),
    (
        "--retry-backoff-max",
        "AIOLOADER_RETRY_BACKOFF_MAX",
        f"longest wait between tries of a failed preload (default {DEFAULT_RETRY_BACKOFF_MAX:g})",
    ),
    (
        "--max-connections",
        "AIOLOADER_MAX_CONNECTIONS",
        f"client connections held at once; past it the longest idle one is closed "
        f"(default {DEFAULT_MAX_CONNECTIONS}, at most half the open-file limit)",
    ),
    (
        "--client-timeout",
        "AIOLOADER_CLIENT_TIMEOUT",
        f"seconds a client has to send a request's headers, and its body "
        f"(default {DEFAULT_CLIENT_TIMEOUT:g})",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aioloader serve``; each flag also reads an environment variable."""
    for flag, env, text in _OPTIONS:
        parser.add_argument(flag, help=f"{text} [{env}]")
    parser.add_argument(
        "--model",
        action="append",
        metavar="URL",
        help="preload this model and keep it cached (repeatable); 'URL priority=N' downloads "
        "it before lower priorities (default 0) [AIOLOADER_MODELS, comma-separated]",
    )
    parser.add_argument(
        "--allow-prefix",
        action="append",
        metavar="PREFIX",
        help="accept only URLs under a prefix, such as s3://bucket/models/ (repeatable) "
        "[AIOLOADER_ALLOW_PREFIXES, comma-separated]",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        default=None,
        help="serve /v1/* without a token, on purpose [AIOLOADER_NO_AUTH=1]",
    )


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


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
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> DaemonConfig:
    """A DaemonConfig: each flag, else its environment variable, else the default.

    Raises:
        ConfigError: a value cannot be read.
    """
    warn_unknown_variables(environ)  # a misspelt AIOLOADER_* is said at startup

    def pick(attr: str, env: str) -> str | None:
        value: str | None = getattr(args, attr, None)
        return value if value is not None else environ.get(env)

    models: Sequence[str] = args.model or _split(environ.get("AIOLOADER_MODELS"))
    prefixes: Sequence[str] = args.allow_prefix or _split(environ.get("AIOLOADER_ALLOW_PREFIXES"))
    where = "--model" if args.model else "AIOLOADER_MODELS"
    preloads: dict[str, int] = {}
    for text in models:
        if text.strip():
            url, priority = parse_preload(text, where)
            preloads.setdefault(url, priority)  # a URL given twice keeps its first entry
    bandwidth = pick("max_bandwidth", "AIOLOADER_MAX_BANDWIDTH")
    bandwidth_what = (
        "--max-bandwidth"
        if getattr(args, "max_bandwidth", None) is not None
        else "AIOLOADER_MAX_BANDWIDTH"
    )
    max_bytes = pick("max_cache_bytes", "AIOLOADER_MAX_CACHE_BYTES")
    cache_dir = pick("cache_dir", "AIOLOADER_CACHE_DIR")
    port = _number(pick("port", "AIOLOADER_PORT"), int, "port")
    concurrency = _number(pick("concurrency", "AIOLOADER_CONCURRENCY"), int, "concurrency")
    downloads = _number(pick("max_downloads", "AIOLOADER_MAX_DOWNLOADS"), int, "max downloads")
    grace = _number(pick("grace_period", "AIOLOADER_GRACE_PERIOD"), float, "grace period")
    backoff = _number(pick("retry_backoff", "AIOLOADER_RETRY_BACKOFF"), float, "retry backoff")
    backoff_max = _number(
        pick("retry_backoff_max", "AIOLOADER_RETRY_BACKOFF_MAX"), float, "retry backoff max"
    )
    connections = _number(
        pick("max_connections", "AIOLOADER_MAX_CONNECTIONS"), int, "max connections"
    )
    client_timeout = _number(
        pick("client_timeout", "AIOLOADER_CLIENT_TIMEOUT"), float, "client timeout"
    )
    no_auth = bool(getattr(args, "no_auth", None)) or _flag(
        environ.get("AIOLOADER_NO_AUTH"), "AIOLOADER_NO_AUTH"
    )
    token_where = "--token" if getattr(args, "token", None) is not None else "AIOLOADER_TOKEN"
    token = read_token(pick("token", "AIOLOADER_TOKEN"), token_where, no_auth=no_auth)
    return DaemonConfig(
        host=pick("host", "AIOLOADER_HOST") or DEFAULT_HOST,
        port=int(port) if port is not None else DEFAULT_PORT,
        cache_dir=Path(cache_dir) if cache_dir else default_cache_dir(environ),
        max_cache_bytes=parse_size(max_bytes, what="max cache bytes") if max_bytes else None,
        models=tuple(preloads),
        priorities=tuple((url, p) for url, p in preloads.items() if p),
        token=token.value,
        no_auth=no_auth,
        notes=token.notes,
        allow_prefixes=tuple(prefixes),
        concurrency=int(concurrency) if concurrency is not None else None,
        max_downloads=int(downloads) if downloads is not None else DEFAULT_MAX_DOWNLOADS,
        max_bandwidth=parse_bandwidth(bandwidth, bandwidth_what) if bandwidth else 0,
        grace_period=float(grace) if grace is not None else DEFAULT_GRACE_PERIOD,
        retry_backoff=float(backoff) if backoff is not None else DEFAULT_RETRY_BACKOFF,
        retry_backoff_max=(
            float(backoff_max) if backoff_max is not None else DEFAULT_RETRY_BACKOFF_MAX
        ),
        max_connections=(int(connections) if connections is not None else DEFAULT_MAX_CONNECTIONS),
        client_timeout=(
            float(client_timeout) if client_timeout is not None else DEFAULT_CLIENT_TIMEOUT
        ),
    )
