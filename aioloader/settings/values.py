"""Settings for a load: small frozen dataclasses with sane defaults."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from ..errors import ConfigError
from ..runtime.container_memory import MemoryLimit, memory_limit

__all__ = [
    "HttpOptions",
    "Limits",
    "S3Options",
    "check_number",
    "parse_size",
    "size_text",
    "staging_budget",
]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

DEFAULT_CONCURRENCY = 16
DEFAULT_CHUNK_SIZE = 16 * MiB
# The staging budget by default takes this share of what the container allows,
# leaving the rest for the tensors themselves, the framework and the server.
DEFAULT_MEMORY_SHARE = 8
DEFAULT_MEMORY_CAP = 2 * GiB
MIN_MEMORY_LIMIT = 64 * KiB
# The longest time any setting may name: a timeout beyond it is a typo (or an attempt
# at "never"), and would overflow the clocks and waits that take it later.
MAX_SECONDS = 10_000_000.0  # about 115 days
# More receive threads than this is a typo: one core receives about 2 GB/s.
MAX_RECEIVE_LANES = 64
AUTO_LANES = "auto"  # receive_lanes: on the caller's loop, then on lanes once it is busy

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
# A header name is an RFC 9110 token; its value may not break the request's lines.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "ki": KiB, "kib": KiB,
    "m": 1000**2, "mb": 1000**2, "mi": MiB, "mib": MiB,
    "g": 1000**3, "gb": 1000**3, "gi": GiB, "gib": GiB,
    "t": 1000**4, "tb": 1000**4, "ti": 1 << 40, "tib": 1 << 40,
}  # fmt: skip


def _shown(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut short: an error message need not repeat a megabyte of input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_number(
    what: str,
    value: object,
    *,
    integer: bool = False,
    positive: bool = False,
    maximum: float | None = None,
) -> None:
    """Refuse anything but a finite, non-negative number (``positive``: above zero).

    ``bool`` is refused even where an ``int`` is wanted (``True`` is not a count), and
    so are NaN, infinities and, with ``integer``, floats.

    Raises:
        ConfigError: naming ``what`` and the value.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (integer and not isinstance(value, int))
    ):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{what} must be {kind}, got {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        bound = "positive" if positive else "zero or more"
        raise ConfigError(f"{what} must be {bound}, got {_shown(value)}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{what} must be at most {maximum:g}, got {_shown(value)}")


def parse_size(value: object, *, what: str = "size") -> int:
    """Parse ``16MiB``, ``2G``, ``4096`` or an int into a byte count.

    ``KB``/``MB``/``GB``/``TB`` are powers of 1000, ``KiB``/``MiB``/``GiB``/``TiB``
    powers of 1024 (the prefix in either case); the ``B`` may be left out (``2G``).

    Raises:
        ConfigError: the value is not a size (a bool, a float, a negative or endless
            number, text that does not read as one), or its unit has a lower-case
            ``b`` (``1Gb``, ``16mb``): bits or bytes, the writer's meaning is not known.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(
            f"{what} must be a byte count (an integer, or text such as '16MiB'), "
            f"got {_shown(value)}"
        )
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{what} must not be negative, got {_shown(value)}")
        return value
    match = _SIZE.match(value)
    if not match:
        raise ConfigError(
            f"{what}: cannot read {_shown(value)} as a size; write bytes or use a unit, "
            "e.g. 16MiB, 2GiB"
        )
    number, unit = match.groups()
    if unit and unit.endswith("b"):
        raise ConfigError(_ambiguous(what, value, number, unit[:-1]))
    scaled = float(number) * _UNITS[(unit or "").lower()]
    if not math.isfinite(scaled):
        raise ConfigError(f"{what}: {_shown(value)} is too large to be a size")
    return int(scaled)


def _ambiguous(what: str, value: str, number: str, prefix: str) -> str:
    """Why a unit with a lower-case ``b`` (``Gb``, ``mb``, ``Kib``) is refused: ``b`` is a
    bit, ``B`` a byte, and which one the writer meant cannot be told."""
    p = prefix[:1].upper()
    forms = f"{number}B"
    if p:
        forms = f"{number}{p}B (powers of 1000) or {number}{p}iB (powers of 1024)"
    return (
        f"{what}: {_shown(value)} is ambiguous: a lower-case b means bits, a capital B "
        f"bytes. Write bytes, e.g. {forms}; a rate known in bits is an eighth of that in "
        "bytes (1 Gb/s is 125MB/s)"
    )


def format_size(n: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def size_text(n: int) -> str:
    """``n`` bytes rounded down to a whole unit, as a size string ``parse_size`` reads
    back and a user can type: ``11GiB``, ``512MiB``, ``300B``."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return f"{max(0, n)}B"


def staging_budget(memory_limit: int | str | None, ceiling: MemoryLimit) -> int:
    """The staging budget in bytes, within the memory ``ceiling`` of this process.

    Args:
        memory_limit: the budget asked for, or ``None`` for the default: an eighth of
            the ceiling, at most 2 GiB.
        ceiling: what this process may use (``container_memory.memory_limit``).

    Raises:
        ConfigError: ``memory_limit`` is not a size, is too small, or is not below the
            ceiling (the container would be OOM-killed).
    """
    allowed = ceiling.bytes
    if memory_limit is None:
        return max(MIN_MEMORY_LIMIT, min(allowed // DEFAULT_MEMORY_SHARE, DEFAULT_MEMORY_CAP))
    budget = parse_size(memory_limit, what="memory_limit")
    if budget < MIN_MEMORY_LIMIT:
        raise ConfigError(
            f"memory_limit must be at least {format_size(MIN_MEMORY_LIMIT)}, got {budget} bytes"
        )
    if budget >= allowed:
        raise ConfigError(
            f"memory_limit {format_size(budget)} is not below what this process may use "
            f"({format_size(allowed)}, from {ceiling.source}); the container "
            f"would be OOM-killed. Use at most half of it, e.g. {size_text(allowed // 2)} "
            f"(--memory-limit {size_text(allowed // 2)}, or AIOLOADER_MEMORY_LIMIT), or leave "
            "it unset for a safe default."
        )
    return budget


@dataclass(frozen=True)
class Limits:
    """How hard a load may push the machine.

    Args:
        concurrency: reads in flight at once (and reader threads for local files).
        chunk_size: the largest single read; big tensors are split into chunks of
            this size read in parallel, small neighbours are merged up to it.
        memory_limit: bytes allowed in flight and in staging at once. ``None``
            derives it from the container's memory limit (cgroup v2, v1, else RAM):
            an eighth of it, at most 2 GiB. An explicit value above what the
            container allows is refused by ``staging_bytes``, when a load asks.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    chunk_size: int = DEFAULT_CHUNK_SIZE
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        check_number("concurrency", self.concurrency, integer=True, positive=True)
        if self.concurrency > 1024:
            raise ConfigError(f"concurrency {self.concurrency} is too high; use 1024 or fewer")
        chunk = parse_size(self.chunk_size, what="chunk_size")
        if chunk < 4 * KiB:
            raise ConfigError(f"chunk_size must be at least 4 KiB, got {chunk} bytes")
        object.__setattr__(self, "chunk_size", chunk)
        if self.memory_limit is not None:
            budget = parse_size(self.memory_limit, what="memory_limit")
            if budget < MIN_MEMORY_LIMIT:
                raise ConfigError(
                    f"memory_limit must be at least {format_size(MIN_MEMORY_LIMIT)}, "
                    f"got {budget} bytes"
                )
            object.__setattr__(self, "memory_limit", budget)

    @property
    def staging_bytes(self) -> int:
        """The staging budget in bytes, within what this process may use now.

        The container's ceiling is read here, where a load needs it, and not kept:
        this value holds settings, not the host; making one reads nothing.

        Raises:
            ConfigError: ``memory_limit`` is not below the ceiling.
        """
        return staging_budget(self.memory_limit, memory_limit())

    @property
    def read_size(self) -> int:
        """The largest single read: ``chunk_size``, shrunk so several fit in the budget."""
        return max(4 * KiB, min(self.chunk_size, self.staging_bytes // 2))

    def with_options(self, **changes: object) -> Limits:
        """A copy with some settings changed (``None`` values are ignored)."""
        given = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **given) if given else self  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, int]:
        return {
            "concurrency": self.concurrency,
            "chunk_size": self.chunk_size,
            "memory_limit": self.staging_bytes,
        }


@dataclass(frozen=True)
class HttpOptions:
    """How remote (HTTP and S3) reads behave.

    Args:
        headers: sent with every request to the URL's own host, e.g.
            ``{"Authorization": "Bearer ..."}``; never forwarded to another host a
            redirect points to.
        max_attempts: tries per byte range before giving up (retries resume from
            the last byte received). A throttling answer (429, 503) counts only
            once requests in flight are down to one.
        backoff: first retry delay in seconds; doubles per attempt, with jitter.
        backoff_max: the longest delay between two attempts.
        stall_timeout: seconds without a single byte before a transfer counts as
            stalled and is retried.
        connect_timeout: seconds to establish a connection.
        min_speed: bytes per second a transfer must average over each
            ``speed_window``, or it is dropped and retried as stalled; an upstream
            that trickles a byte at a time never trips ``stall_timeout``. ``0``
            turns the check off.
        speed_window: seconds over which ``min_speed`` is measured.
        deadline: seconds one byte range may take, every attempt included
            (``None``: no limit beyond the attempts and the checks above).
        receive_lanes: threads that receive range bodies into their tensors, each with
            its own event loop and connections; ``1`` receives them on the caller's
            event loop, as one core can (raise it when that thread is the bottleneck);
            ``"auto"`` starts there and moves to lanes once that thread is measured
            busy (sources/http/lanes.py).
        url_policy: called with every URL before a request is sent to it (the URL
            asked for, each shard an index names, each redirect target); it raises a
            ``LoaderError`` to refuse one. The preload daemon's allow-list is one.
    """

    headers: tuple[tuple[str, str], ...] = ()
    max_attempts: int = 6
    backoff: float = 0.2
    backoff_max: float = 10.0
    stall_timeout: float = 30.0
    connect_timeout: float = 10.0
    min_speed: int = 16 * KiB
    speed_window: float = 30.0
    deadline: float | None = None
    receive_lanes: int | Literal["auto"] = 1
    url_policy: Callable[[str], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.headers, dict):
            object.__setattr__(self, "headers", tuple(self.headers.items()))
        for name, value in self.headers:
            _check_header(name, value)
        check_number("max_attempts", self.max_attempts, integer=True, positive=True)
        for name in ("backoff", "backoff_max"):
            check_number(name, getattr(self, name), maximum=MAX_SECONDS)
        # A timeout of 0 fails every connection and every read at once.
        for name in ("stall_timeout", "connect_timeout"):
            check_number(name, getattr(self, name), positive=True, maximum=MAX_SECONDS)
        check_number("min_speed", self.min_speed)
        check_number("speed_window", self.speed_window, positive=True, maximum=MAX_SECONDS)
        if self.deadline is not None:
            check_number("deadline", self.deadline, positive=True, maximum=MAX_SECONDS)
        if self.receive_lanes == AUTO_LANES and isinstance(self.receive_lanes, str):
            return
        try:
            check_number(
                "receive_lanes", self.receive_lanes, integer=True, positive=True,
                maximum=MAX_RECEIVE_LANES,
            )  # fmt: skip
        except ConfigError as exc:
            raise ConfigError(
                f"{exc}: the threads that receive range bodies, from 1 (the event loop's "
                f"own, the default) to {MAX_RECEIVE_LANES}, or {AUTO_LANES!r} (lanes "
                "once the loop is busy)"
            ) from None


@dataclass(frozen=True)
class S3Options:
    """Where and how to reach S3-compatible storage.

    Unset fields come from the standard AWS configuration: ``AWS_ENDPOINT_URL_S3``
    / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``,
    shared config and credentials files, web identity and instance metadata
    (``AWS_EC2_METADATA_DISABLED=true`` turns the latter off; do that outside AWS).

    Args:
        endpoint_url: e.g. ``http://minio:9000`` for MinIO or Ceph RGW.
        region: the signing region (default ``us-east-1``).
        addressing: ``"path"`` (``endpoint/bucket/key``), ``"virtual"``
            (``bucket.endpoint/key``) or ``"auto"``: path-style for custom
            endpoints, virtual-hosted on AWS. ``AIOLOADER_S3_ADDRESSING`` sets it when
            neither this object nor ``s3_addressing=`` is given.
        anonymous: send unsigned requests (public buckets). Also used when no
            credentials are found at all.
        profile: a profile from the shared AWS config files.
    """

    endpoint_url: str | None = None
    region: str | None = None
    addressing: str = "auto"
    anonymous: bool = False
    profile: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint_url is not None:
            _check_endpoint(self.endpoint_url)
        if self.addressing not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"addressing must be 'auto', 'path' or 'virtual', got {self.addressing!r}"
            )


def _check_header(name: object, value: object) -> None:
    """Refuse a header no request can carry (its value is not shown: it may be a token)."""
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        raise ConfigError(
            f"headers: {_shown(name)} is not a header name (letters, digits and "
            "!#$%&'*+-.^_`|~ only); write {'Name': 'value'}"
        )
    if not isinstance(value, str):
        raise ConfigError(f"headers: the value of {name} must be text, not {type(value).__name__}")
    if any((ord(c) < 0x20 and c != "\t") or c == "\x7f" for c in value):
        raise ConfigError(
            f"headers: the value of {name} holds a line break or another control character, "
            "which would break the request; remove it (a trailing newline from a file, say)"
        )
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise ConfigError(
            f"headers: the value of {name} holds characters HTTP cannot send (beyond "
            "Latin-1); encode it as the server expects"
        ) from None


def _check_endpoint(url: object) -> None:
    """An S3 endpoint is an http(s) URL with a host: ``http://minio:9000``."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(
            f"s3_endpoint_url must be an http:// or https:// URL with a host, such as "
            f"http://minio:9000, not {_shown(url)}"
        )
