"""``LoadOptions``: everything a load takes, one frozen value built once.

The loose keywords a load takes (``concurrency=``, ``headers=``, ``s3_region=`` ...)
are listed once, in ``KEYWORDS``: ``Loader``, ``load_model``, ``ModelCache.fetch``,
Ray's helpers and vLLM's ``--model-loader-extra-config`` take them; the command
line's flags are made from the same table. ``LoadOptions.build`` merges them, in
this order of precedence:

1. a keyword given explicitly (``None`` counts as not given);
2. a settings object given explicitly (``limits=``, ``http=``, ``s3=``) for its fields;
3. the environment, ``AIOLOADER_<NAME>`` (``AIOLOADER_CONCURRENCY=32``), for the
   keywords that have one; a value that does not parse is a ``ConfigError`` naming
   the variable;
4. the defaults of ``Limits``, ``HttpOptions`` and ``S3Options``.

Every value is checked where it lands (config.py), so a wrong one is refused with
its name before anything is read.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict

from .config import MAX_SECONDS, HttpOptions, Limits, S3Options, check_number
from .environment import warn_unknown_variables
from .errors import ConfigError

__all__ = ["KEYWORDS", "Keyword", "LoadKeywords", "LoadOptions"]

Group = Literal["limits", "http", "s3", "load"]


def _text(value: str) -> str:
    return value


def _integer(value: str) -> int:
    return int(value.strip())


def _seconds(value: str) -> float:
    return float(value.strip())


def _switch(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not 0 or 1")


def _cache_dir(value: str) -> str | Literal[False]:
    return value if value.strip() else False  # an empty variable: no cache


@dataclass(frozen=True)
class Keyword:
    """One loose keyword of a load.

    Attributes:
        name: the keyword (and, upper-cased, ``AIOLOADER_<NAME>``; ``--name-with-dashes``).
        group: where it lands: a field of ``Limits``, ``HttpOptions``, ``S3Options`` or
            of ``LoadOptions`` itself.
        field: its name there.
        types: the Python types it accepts.
        help: what it is, in a few words.
        parse: turns its text (an environment variable, a flag) into a value; ``None``
            for keywords that have no text form (a mapping, a process group).
        env: whether ``AIOLOADER_<NAME>`` sets it.
    """

    name: str
    group: Group
    field: str
    types: tuple[type, ...]
    help: str
    parse: Callable[[str], Any] | None = _text
    env: bool = True

    @property
    def variable(self) -> str:
        return f"AIOLOADER_{self.name.upper()}"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


KEYWORDS: tuple[Keyword, ...] = (
    Keyword(
        "concurrency",
        "limits",
        "concurrency",
        (int,),
        "reads in flight at once",
        parse=_integer,
        env=True,
    ),
    Keyword(
        "chunk_size",
        "limits",
        "chunk_size",
        (int, str),
        'the largest single read, e.g. "16MiB"',
        parse=_text,
        env=True,
    ),
    Keyword(
        "memory_limit",
        "limits",
        "memory_limit",
        (int, str),
        'bytes in flight and staged at once, e.g. "2GiB"',
        parse=_text,
        env=True,
    ),
    Keyword(
        "headers",
        "http",
        "headers",
        (dict,),
        "extra HTTP headers, e.g. an Authorization token",
        parse=None,
        env=False,
    ),
    Keyword(
        "max_attempts",
        "http",
        "max_attempts",
        (int,),
        "attempts per range read before giving up",
        parse=_integer,
        env=True,
    ),
    Keyword(
        "backoff",
        "http",
        "backoff",
        (int, float),
        "seconds before the first retry (doubles each time)",
        parse=_seconds,
        env=True,
    ),
    Keyword(
        "backoff_max",
        "http",
        "backoff_max",
        (int, float),
        "the longest pause between retries, in seconds",
        parse=_seconds,
        env=True,
    ),
    Keyword(
        "stall_timeout",
        "http",
        "stall_timeout",
        (int, float),
        "seconds without a byte before a read is retried",
        parse=_seconds,
        env=True,
    ),
    Keyword(
        "connect_timeout",
        "http",
        "connect_timeout",
        (int, float),
        "seconds to connect",
        parse=_seconds,
        env=True,
    ),
    Keyword(
        "min_speed",
        "http",
        "min_speed",
        (int,),
        "bytes per second a transfer must average, or be retried",
        parse=_integer,
        env=True,
    ),
    Keyword(
        "deadline",
        "http",
        "deadline",
        (int, float),
        "seconds one byte range may take, every attempt included",
        parse=_seconds,
        env=True,
    ),
    Keyword(
        "s3_endpoint_url",
        "s3",
        "endpoint_url",
        (str,),
        "an S3-compatible endpoint (MinIO, Ceph RGW)",
        parse=_text,
        env=False,
    ),
    Keyword(
        "s3_region",
        "s3",
        "region",
        (str,),
        "the S3 signing region",
        parse=_text,
        env=False,
    ),
    Keyword(
        "s3_addressing",
        "s3",
        "addressing",
        (str,),
        '"auto", "path" or "virtual"',
        parse=_text,
        env=False,
    ),
    Keyword(
        "s3_anonymous",
        "s3",
        "anonymous",
        (bool,),
        "unsigned S3 requests (public buckets)",
        parse=_switch,
        env=False,
    ),
    Keyword(
        "s3_profile",
        "s3",
        "profile",
        (str,),
        "a profile of the shared AWS config files",
        parse=_text,
        env=False,
    ),
    Keyword(
        "cache_dir",
        "load",
        "cache_dir",
        (str, os.PathLike),
        "a node cache folder that remote files are kept in",
        parse=_cache_dir,
        env=True,
    ),
    Keyword(
        "hf_cache",
        "load",
        "hf_cache",
        (bool,),
        "write hf:// models into the Hugging Face cache (0 to turn off)",
        parse=_switch,
        env=True,
    ),
    Keyword(
        "hf_revision_timeout",
        "load",
        "hf_revision_timeout",
        (int, float),
        "seconds to ask the Hub where a cached hf:// branch is before loading the cached commit",
        parse=_seconds,
        env=True,
    ),
    Keyword(
        "hf_fresh",
        "load",
        "hf_fresh",
        (bool,),
        "fail, not load the cached commit, when the Hub does not say where an hf:// branch is",
        parse=_switch,
        env=True,
    ),
    Keyword(
        "device",
        "load",
        "device",
        (str,),
        '"cpu", "cuda" or "cuda:N"',
        parse=_text,
        env=False,
    ),
    Keyword(
        "framework",
        "load",
        "framework",
        (str,),
        '"torch", "numpy" or "cupy"',
        parse=_text,
        env=False,
    ),
)
"""The loose keywords of a load, in the order the command line shows them."""

_BY_NAME = {k.name: k for k in KEYWORDS}


class LoadKeywords(TypedDict, total=False):
    """The keywords ``load_model``, ``Loader`` and ``ModelCache.fetch`` take (for type
    checkers: ``KEYWORDS`` says what each is, and a test keeps the two in step)."""

    concurrency: int | None
    chunk_size: int | str | None
    memory_limit: int | str | None
    headers: Mapping[str, str] | None
    max_attempts: int | None
    backoff: float | None
    backoff_max: float | None
    stall_timeout: float | None
    connect_timeout: float | None
    min_speed: int | None
    deadline: float | None
    s3_endpoint_url: str | None
    s3_region: str | None
    s3_addressing: str | None
    s3_anonymous: bool | None
    s3_profile: str | None
    cache_dir: Any
    hf_cache: bool | None
    hf_revision_timeout: float | None
    hf_fresh: bool | None
    device: Any
    framework: str | None
    limits: Limits | None
    http: HttpOptions | None
    s3: S3Options | None
    group: Any


_OBJECTS = ("limits", "http", "s3", "group")  # keywords that are not in KEYWORDS


def _unknown(name: str) -> ConfigError:
    known = sorted([*_BY_NAME, *_OBJECTS])
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown option {name!r}{hint}; the options are: {', '.join(known)}")


def _checked(keyword: Keyword, value: Any) -> Any:
    wrong_bool = isinstance(value, bool) and bool not in keyword.types
    if keyword.name == "device" and not isinstance(value, str):
        return value  # a torch.device: devices/auto.py checks it
    if keyword.name == "cache_dir":
        from .cache import ModelCache

        if value is False or isinstance(value, ModelCache):
            return value
    if not isinstance(value, keyword.types) or wrong_bool:
        names = " or ".join(t.__name__ for t in keyword.types)
        raise ConfigError(f"{keyword.name} must be {names} ({keyword.help}), not {value!r}")
    if isinstance(value, dict):  # headers
        return tuple((str(k), str(v)) for k, v in value.items())
    if keyword.name == "cache_dir" and isinstance(value, str) and not value.strip():
        raise ConfigError(f"cache_dir must name a folder, not {value!r}; False for no cache")
    return value


def _from_environment(keyword: Keyword, environ: Mapping[str, str]) -> Any:
    text = environ.get(keyword.variable)
    if text is None or keyword.parse is None:
        return None
    try:
        return keyword.parse(text)
    except ValueError as exc:
        raise ConfigError(
            f"{keyword.variable}={text!r} is not a valid {keyword.name} ({keyword.help}): {exc}"
        ) from None


@dataclass(frozen=True)
class LoadOptions:
    """Everything a load takes; build it with ``LoadOptions.build(**keywords)``.

    Attributes:
        device: where tensors go (``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device``).
        framework: ``"torch"``, ``"numpy"`` or ``"cupy"``.
        limits: concurrency, read size and the staging budget.
        http: retries, timeouts and headers of remote reads (``None``: the defaults).
        s3: where and how to reach S3 (``None``: the AWS configuration).
        cache_dir: the node cache (a folder or a ``ModelCache``), ``False`` for none,
            ``None`` for ``$AIOLOADER_CACHE_DIR`` (resolved by ``build``).
        hf_cache: hf:// loads into host memory also fill the Hugging Face hub cache
            (not when ``cache_dir`` is set: the node cache keeps those files then).
        hf_revision_timeout: seconds an hf:// branch or tag the hub cache holds is asked
            about, every attempt included; without an answer the cached commit is
            loaded, with a warning (sources/hf/revision.py).
        hf_fresh: fail instead, when the Hub gives no answer.
        group: a ``torch.distributed`` gloo group whose ranks share the reads.
    """

    device: Any = "cpu"
    framework: str = "torch"
    limits: Limits | None = None
    http: HttpOptions | None = None
    s3: S3Options | None = None
    cache_dir: Any = None
    hf_cache: bool = True
    hf_revision_timeout: float = 10.0
    hf_fresh: bool = False
    group: Any = None

    def __post_init__(self) -> None:
        check_number(
            "hf_revision_timeout", self.hf_revision_timeout, positive=True, maximum=MAX_SECONDS
        )

    @classmethod
    def build(
        cls,
        base: LoadOptions | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        **given: Any,
    ) -> LoadOptions:
        """Merge keywords, settings objects, the environment and ``base`` (see the module).

        Raises:
            ConfigError: an unknown keyword (with the closest known one), a value of the
                wrong type or out of range, or an environment variable that does not parse.
        """
        environ = os.environ if environ is None else environ
        warn_unknown_variables(environ)  # a misspelt AIOLOADER_* is said, once
        base = base or cls()
        for name in given:
            if name not in _BY_NAME and name not in _OBJECTS:
                raise _unknown(name)
        objects: dict[str, Any] = {
            "limits": given.get("limits") or base.limits,
            "http": given.get("http") or base.http,
            "s3": given.get("s3") or base.s3,
        }
        for name, kind in (("limits", Limits), ("http", HttpOptions), ("s3", S3Options)):
            if objects[name] is not None and not isinstance(objects[name], kind):
                raise ConfigError(f"{name} must be a {kind.__name__}, not {objects[name]!r}")
        changes: dict[str, dict[str, Any]] = {"limits": {}, "http": {}, "s3": {}, "load": {}}
        for keyword in KEYWORDS:
            value = given.get(keyword.name)
            if value is not None:
                value = _checked(keyword, value)
            elif keyword.env and objects.get(keyword.group) is None:
                value = _from_environment(keyword, environ)
            if value is not None:
                changes[keyword.group][keyword.field] = value
        load = changes["load"]
        limits = objects["limits"] or Limits()
        if changes["limits"]:
            limits = replace(limits, **changes["limits"])
        http = objects["http"]
        if changes["http"]:
            http = replace(http or HttpOptions(), **changes["http"])
        s3 = objects["s3"]
        if changes["s3"]:
            s3 = replace(s3 or S3Options(), **changes["s3"])
        cache_dir = load.get("cache_dir", base.cache_dir)
        if cache_dir is None:
            cache_dir = _from_environment(_BY_NAME["cache_dir"], environ)
        return cls(
            device=load.get("device", base.device),
            framework=load.get("framework", base.framework),
            limits=limits,
            http=http,
            s3=s3,
            cache_dir=False if cache_dir is None else cache_dir,
            hf_cache=load.get("hf_cache", base.hf_cache),
            hf_revision_timeout=load.get("hf_revision_timeout", base.hf_revision_timeout),
            hf_fresh=load.get("hf_fresh", base.hf_fresh),
            group=given.get("group", base.group),
        )

    def with_changes(self, **given: Any) -> LoadOptions:
        """A copy with some keywords changed (the environment is not read again)."""
        return LoadOptions.build(self, environ={}, **given)
