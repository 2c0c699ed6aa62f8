"""The settings table: one row per setting, and the parsers of their text forms.

A row (``Setting``) names a setting once; from it come the keyword, the environment
variable ``AIOLOADER_<NAME>``, the command-line flag and the line of the docs. The
rows are grouped by who takes them:

- ``KEYWORDS``: the keywords of a load (``Loader``, ``load_model``, ``ModelCache.fetch``,
  ``aioloader load``, vLLM, Ray); ``options.LoadOptions.build`` merges them.
- ``DAEMON``: the flags of ``aioloader serve``; ``daemon/config.py`` reads them.
- ``FETCH``: the flags of ``aioloader fetch`` beyond a load's (its node's daemon).
- ``CHECK_ETAG`` and ``AZURE_IDENTITY``: taken by the cache's and Azure's constructors.

Every variable is read by ``environment.from_environment`` and nowhere else, with one
precedence: an explicit value (keyword, flag, argument) > the environment > the default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import texts

__all__ = ["AZURE_IDENTITY", "CHECK_ETAG", "DAEMON", "FETCH", "KEYWORDS", "ROWS", "Setting"]

Group = Literal["limits", "http", "s3", "load", "daemon", "cache", "azure", "fetch"]


@dataclass(frozen=True)
class Setting:
    """One setting: a keyword or flag, its variable, its type and its help.

    Attributes:
        name: the keyword (and, upper-cased, ``AIOLOADER_<NAME>``; ``--name-with-dashes``).
        group: where it lands: a field of ``Limits``, ``HttpOptions``, ``S3Options`` or
            ``LoadOptions`` (a load's keywords), of ``DaemonConfig`` (``"daemon"``), or
            an argument of ``ModelCache`` (``"cache"``) or of the Azure signer.
        types: the Python types it accepts as a keyword.
        help: what it is, in a few words.
        parse: turns its text (a variable, a flag) into a value; ``None`` for settings
            that have no text form (a mapping, a process group).
        env: whether ``AIOLOADER_<NAME>`` sets it.
        field: its name where it lands (``""``: ``name``).
        default: the value when neither given nor in the environment (``None``: the
            default of the dataclass it lands in).
        option: the flag's name when it is not ``name`` (``--model`` for ``models``).
        action: the flag's ``argparse`` action (``"append"``, ``"store_true"``).
        blank_unset: an empty variable (``""``) counts as unset.
    """

    name: str
    group: Group
    types: tuple[type, ...]
    help: str
    parse: Callable[[str], Any] | None = texts.text
    env: bool = True
    field: str = ""
    default: Any = None
    option: str = ""
    action: str | None = None
    blank_unset: bool = False

    def __post_init__(self) -> None:
        if not self.field:
            object.__setattr__(self, "field", self.name)

    @property
    def variable(self) -> str:
        return f"AIOLOADER_{self.name.upper()}"

    @property
    def flag(self) -> str:
        return "--" + (self.option or self.name).replace("_", "-")

    @property
    def dest(self) -> str:
        """The ``argparse`` attribute the flag lands in."""
        return (self.option or self.name).replace("-", "_")


_NUMBER = (int, float)

KEYWORDS: tuple[Setting, ...] = (
    Setting("concurrency", "limits", (int,), "reads in flight at once", texts.integer),
    Setting("chunk_size", "limits", (int, str), 'the largest single read, e.g. "16MiB"'),
    Setting(
        "memory_limit", "limits", (int, str), 'bytes in flight and staged at once, e.g. "2GiB"'
    ),
    Setting(
        "headers",
        "http",
        (dict,),
        "extra HTTP headers, e.g. an Authorization token",
        None,
        env=False,
    ),
    Setting(
        "max_attempts", "http", (int,), "attempts per range read before giving up", texts.integer
    ),
    Setting(
        "backoff",
        "http",
        _NUMBER,
        "seconds before the first retry (doubles each time)",
        texts.seconds,
    ),
    Setting(
        "backoff_max",
        "http",
        _NUMBER,
        "the longest pause between retries, in seconds",
        texts.seconds,
    ),
    Setting(
        "stall_timeout",
        "http",
        _NUMBER,
        "seconds without a byte before a read is retried",
        texts.seconds,
    ),
    Setting("connect_timeout", "http", _NUMBER, "seconds to connect", texts.seconds),
    Setting(
        "min_speed",
        "http",
        (int,),
        "bytes per second a transfer must average, or be retried",
        texts.integer,
    ),
    Setting("deadline", "http", _NUMBER, "seconds a byte range may take, all tries", texts.seconds),
    Setting("receive_lanes", "http", (int, str), "threads receiving bodies (or auto)", texts.lanes),
    Setting(
        "s3_endpoint_url",
        "s3",
        (str,),
        "an S3-compatible endpoint (MinIO, Ceph RGW)",
        env=False,
        field="endpoint_url",
    ),
    Setting("s3_region", "s3", (str,), "the S3 signing region", env=False, field="region"),
    Setting(
        "s3_addressing",
        "s3",
        (str,),
        '"auto", "path" or "virtual": bucket in the path or in the host name',
        texts.addressing,
        field="addressing",
        blank_unset=True,
    ),
    Setting(
        "s3_anonymous",
        "s3",
        (bool,),
        "unsigned S3 requests (public buckets)",
        texts.switch,
        env=False,
        field="anonymous",
    ),
    Setting(
        "s3_profile",
        "s3",
        (str,),
        "a profile of the shared AWS config files",
        env=False,
        field="profile",
    ),
    Setting(
        "cache_dir",
        "load",
        (str, os.PathLike),
        "a node cache folder that remote files are kept in",
        texts.cache_dir,
    ),
    Setting(
        "hf_cache",
        "load",
        (bool,),
        "write hf:// models into the Hugging Face cache (0 to turn off)",
        texts.switch,
    ),
    Setting(
        "hf_revision_timeout",
        "load",
        _NUMBER,
        "seconds to ask the Hub where a cached hf:// branch is before loading the cached commit",
        texts.seconds,
    ),
    Setting(
        "hf_fresh",
        "load",
        (bool,),
        "fail, not load the cached commit, when the Hub does not say where an hf:// branch is",
        texts.switch,
    ),
    Setting("device", "load", (str,), '"cpu", "cuda" or "cuda:N"', env=False),
    Setting("framework", "load", (str,), '"torch", "numpy" or "cupy"', env=False),
)
"""The loose keywords of a load, in the order the command line shows them."""

CHECK_ETAG = Setting(
    "check_etag",
    "cache",
    (bool,),
    "check S3 downloads against ETags that are MD5s (0 for stores whose ETags only look so)",
    texts.switch,
    default=True,
    blank_unset=True,
)
"""``ModelCache(check_etag=)``."""

AZURE_IDENTITY = Setting(
    "azure_identity",
    "azure",
    (bool,),
    "sign Azure requests with DefaultAzureCredential (azure-identity) when nothing else is set",
    texts.switch,
    default=False,
    blank_unset=True,
)
"""Whether the Azure signer asks azure-identity for a token (also when ``AZURE_CLIENT_ID``,
``AZURE_FEDERATED_TOKEN_FILE`` or ``IDENTITY_ENDPOINT`` is set)."""


def _daemon(name: str, help: str, **row: Any) -> Setting:
    """A row of ``aioloader serve``: its text, checked and converted by daemon/config.py
    (which names the flag or the variable the text came from)."""
    row.setdefault("blank_unset", True)
    return Setting(name, "daemon", row.pop("types", (str,)), help, **row)


DAEMON: tuple[Setting, ...] = (
    _daemon("host", "address to listen on (default 127.0.0.1)"),
    _daemon("port", "port to listen on (default 8790)", types=(int,)),
    _daemon("cache_dir", "cache folder (default ~/.cache/aioloader)", types=(str, Path)),
    _daemon("max_cache_bytes", "cache size limit, e.g. 200GiB", types=(int, str)),
    _daemon(
        "token",
        "bearer token required on /v1/*, 16 characters or more, e.g. from `openssl rand -hex "
        "32` (prefer the env var; surrounding whitespace is stripped)",
        blank_unset=False,  # set but empty is refused: it would leave /v1/* open
    ),
    _daemon(
        "token_file",
        "a file holding the bearer token (a mounted Secret), read once at startup; "
        "instead of --token",
        types=(str, Path),
        field="token",
    ),
    _daemon("concurrency", "reads in flight per download", types=(int,)),
    _daemon(
        "max_downloads",
        "models downloading at once, highest priority first (default 2)",
        types=(int,),
    ),
    _daemon(
        "max_bandwidth",
        "bytes per second all downloads share, e.g. 500MB/s (default 0: no cap)",
        types=(int, str),
    ),
    _daemon("grace_period", "seconds from SIGTERM to exit (default 25)", types=_NUMBER),
    _daemon(
        "retry_backoff",
        "seconds before a failed preload is tried again; doubles per failure (default 1)",
        types=_NUMBER,
    ),
    _daemon(
        "retry_backoff_max",
        "longest wait between tries of a failed preload (default 300)",
        types=_NUMBER,
    ),
    _daemon(
        "max_connections",
        "client connections held at once; past it the longest idle one is closed "
        "(default 1000, at most half the open-file limit)",
        types=(int,),
    ),
    _daemon(
        "client_timeout",
        "seconds a client has to send a request's headers, and its body (default 10)",
        types=_NUMBER,
    ),
    _daemon(
        "models",
        "preload this model and keep it cached (repeatable); 'URL priority=N' downloads "
        "it before lower priorities (default 0)",
        types=(tuple,),
        parse=texts.items,
        option="model",
        action="append",
    ),
    _daemon(
        "allow_prefixes",
        "accept only URLs under a prefix, such as s3://bucket/models/ (repeatable)",
        types=(tuple,),
        parse=texts.items,
        option="allow_prefix",
        action="append",
    ),
    _daemon(
        "peers",
        "share models with these daemons over BitTorrent: their host:port (API), or a DNS "
        "name resolving to each (a headless Service), comma-separated; needs aioloader[swarm]",
    ),
    _daemon("swarm_port", "port the swarm listens on (default 6881)", types=(int,)),
    _daemon(
        "swarm_wait",
        "seconds a download waits for the peers' answers, up to 5 times while a listed peer "
        "is silent and nobody has the model (default 2)",
        types=_NUMBER,
    ),
    _daemon(
        "swarm_stall",
        "seconds without swarm progress before turning to the origin (default 30)",
        types=_NUMBER,
    ),
    _daemon(
        "swarm_rate",
        "bytes per second the swarm sends at most, and takes, e.g. 100MB/s; peers in the "
        "cluster included (default 0: no cap)",
        types=(int, str),
    ),
    _daemon(
        "swarm_origin_requests",
        "requests in flight to one origin for the whole cluster, shared out among the "
        "nodes that pull from it (the lowest any node is given holds; default 64, 0: no cap)",
        types=(int,),
    ),
    _daemon(
        "swarm_host",
        "address the swarm listens on (default --host; with 0.0.0.0 the address a peer reached)",
    ),
    _daemon(
        "no_auth",
        "serve /v1/* without a token, on purpose",
        types=(bool,),
        action="store_true",
    ),
)
"""The settings of ``aioloader serve``, in the order ``--help`` shows them."""

FETCH: tuple[Setting, ...] = (
    Setting(
        "daemon",
        "fetch",
        (str,),
        "the node's `aioloader serve`, http://HOST:PORT: it downloads the model and fetch "
        "copies it from its cache (unset: fetch downloads it itself)",
        blank_unset=True,
    ),
    Setting(
        "daemon_wait",
        "fetch",
        _NUMBER,
        "seconds fetch waits for the daemon's download to move before giving up (600)",
        texts.seconds,
        default=600.0,
        blank_unset=True,
    ),
)
"""The settings of ``aioloader fetch`` beyond a load's; ``--token`` is the daemon's row."""

ROWS: tuple[Setting, ...] = (*KEYWORDS, CHECK_ETAG, AZURE_IDENTITY, *DAEMON, *FETCH)
"""Every setting aioloader reads; ``AIOLOADER_*`` variables not named here are warned of."""
