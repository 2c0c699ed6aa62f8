"""``LoadOptions``: everything a load takes, one frozen value built once.

The loose keywords a load takes (``concurrency=``, ``headers=``, ``s3_region=`` ...)
are rows of the settings table, ``settings.KEYWORDS``: ``Loader``, ``load_model``,
``ModelCache.fetch``, Ray's helpers and vLLM's ``--model-loader-extra-config`` take
them; the command line's flags are made from the same rows. ``LoadOptions.build``
merges them, in this order of precedence:

1. a keyword given explicitly (``None`` counts as not given);
2. a settings object given explicitly (``limits=``, ``http=``, ``s3=``) for its fields;
3. the variable ``AIOLOADER_<NAME>`` (``AIOLOADER_CONCURRENCY=32``), for the keywords
   that have one (read by ``environment.from_environment``); a value that does not
   parse is a ``ConfigError`` naming the variable;
4. the defaults of ``Limits``, ``HttpOptions`` and ``S3Options``.

Every value is checked where it lands (config.py), so a wrong one is refused with
its name before anything is read.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypedDict, runtime_checkable

from ..errors import ConfigError
from .resolver import from_environment, warn_unknown_variables
from .table import KEYWORDS
from .table import Setting as Keyword
from .values import MAX_SECONDS, HttpOptions, Limits, S3Options, check_number

__all__ = ["KEYWORDS", "Keyword", "LoadKeywords", "LoadOptions", "NodeCache"]


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
    receive_lanes: int | str | None
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


@runtime_checkable
class NodeCache(Protocol):
    """What ``cache_dir=`` takes besides a folder: a ``ModelCache`` (named by what it
    offers: the cache package imports this module, not the other way round)."""

    @property
    def root(self) -> Path: ...

    async def fetch(self, url: str, **keywords: Any) -> Any: ...


def _checked(keyword: Keyword, value: Any) -> Any:
    wrong_bool = isinstance(value, bool) and bool not in keyword.types
    if keyword.name == "device" and not isinstance(value, str):
        return value  # a torch.device: devices/auto.py checks it
    if keyword.name == "cache_dir" and (value is False or isinstance(value, NodeCache)):
        return value
    if not isinstance(value, keyword.types) or wrong_bool:
        names = " or ".join(t.__name__ for t in keyword.types)
        raise ConfigError(f"{keyword.name} must be {names} ({keyword.help}), not {value!r}")
    if isinstance(value, dict):  # headers
        return tuple((str(k), str(v)) for k, v in value.items())
    if keyword.name == "cache_dir" and isinstance(value, str) and not value.strip():
        raise ConfigError(f"cache_dir must name a folder, not {value!r}; False for no cache")
    return value


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
        warn_unknown_variables(environ)  # a misspelt variable is said, once
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
                value = from_environment(keyword, environ)
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
            cache_dir = from_environment(_BY_NAME["cache_dir"], environ)
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
