"""Reading settings from the environment: the one place ``AIOLOADER_*`` is read.

``from_environment`` reads a row's variable (settings.py); ``resolve`` applies the one
precedence: an explicit value > the environment > the row's default. A misspelt
variable (``CONCURENCY`` for ``CONCURRENCY``) would otherwise be ignored
without a word and the load run with the default: ``warn_unknown_variables`` says it,
once, naming the closest variable that a row reads, never its value (it may be a secret).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..redact import redacting_logger
from .table import ROWS, Setting

__all__ = [
    "PREFIX",
    "from_environment",
    "known_variables",
    "resolve",
    "resolve_where",
    "warn_unknown_variables",
]

logger = redacting_logger(__name__)

PREFIX = "AIOLOADER_"

_warned: set[str] = set()


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def from_environment(row: Setting, environ: Mapping[str, str] | None = None) -> Any:
    """The value of ``row``'s variable in ``environ`` (``None``: this process's), parsed;
    ``None`` when it is not set (or, for a row that says so, empty) or has no text form.

    Raises:
        ConfigError: naming the variable, when its text does not parse.
    """
    text = _environ(environ).get(row.variable) if row.env else None
    if text is None or row.parse is None or (row.blank_unset and text == ""):
        return None
    try:
        return row.parse(text)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"{row.variable}={text!r:.80} is not a valid {row.name} ({row.help}): {exc}"
        ) from None


def resolve_where(
    row: Setting, given: Any = None, environ: Mapping[str, str] | None = None
) -> tuple[Any, str | None]:
    """``row``'s value and where it came from: ``given`` (``None`` counts as not given,
    named by the flag), else the environment (named by the variable), else the default
    (``None``).

    Raises:
        ConfigError: the variable is set and does not parse.
    """
    if given is not None:
        return given, row.flag
    value = from_environment(row, environ)
    if value is not None:
        return value, row.variable
    return row.default, None


def resolve(row: Setting, given: Any = None, environ: Mapping[str, str] | None = None) -> Any:
    """``given`` if not ``None``, else ``row``'s variable, else the row's default.

    Raises:
        ConfigError: the variable is set and does not parse.
    """
    return resolve_where(row, given, environ)[0]


def known_variables() -> frozenset[str]:
    """Every variable aioloader reads: those of the rows of settings.py."""
    return frozenset(row.variable for row in ROWS if row.env)


def warn_unknown_variables(environ: Mapping[str, str] | None = None) -> None:
    """Log a warning for each variable of ``environ`` named ``PREFIX...`` (``None``: this
    process's) that aioloader does not read, naming the known one closest to it; each
    name once per process."""
    names = [n for n in _environ(environ) if n.startswith(PREFIX) and n not in _warned]
    if not names:
        return
    known = known_variables()
    for name in sorted(set(names) - known):
        _warned.add(name)
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        logger.warning(
            "%s is set but aioloader reads no such variable, so it is ignored; %s"
            "the variables it reads are listed in docs/options.md and docs/kubernetes.md",
            name,
            hint,
        )
