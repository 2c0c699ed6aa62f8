"""``aioloader fetch``'s settings of the node's daemon: its URL, how long to wait for
it, and its token (a flag, a variable or a file), read and checked (daemon_client.py
uses them). The rows are settings.FETCH's, and the daemon's own ``token`` and
``token_file`` rows: a token file is read and checked as ``aioloader serve`` reads its
own (daemon/auth.py), and a token given twice is an error naming both.
"""

from __future__ import annotations

import argparse
import math
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..redact import redact
from ..settings.resolver import resolve_where
from ..settings.table import DAEMON, FETCH

__all__ = ["add_arguments", "check_daemon_url", "check_daemon_wait", "daemon_of", "from_args"]

_MAX_URL = 2048
_MAX_WAIT = 7 * 24 * 3600.0
_URL_ROW, _WAIT_ROW = FETCH
_TOKEN_ROW = next(row for row in DAEMON if row.name == "token")
_TOKEN_FILE_ROW = next(row for row in DAEMON if row.name == "token_file")


def check_daemon_url(value: object, where: str = "--daemon") -> str:
    """The daemon's base URL (``http(s)://host:port``), or a ConfigError naming ``where``."""
    shape = "write the daemon's address as http://HOST:PORT (its `aioloader serve` port)"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be the daemon's URL, not {value!r}: {shape}")
    if len(value) > _MAX_URL:
        raise ConfigError(f"{where} is {len(value)} characters long: {shape}")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{where} {value!r:.80} holds whitespace or a control character")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where} {value!r:.80} is not an http:// URL: {shape}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"{where} holds user info; give the daemon's token with --token or "
            "AIOLOADER_TOKEN instead"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{where} {redact(value)} has a query or a fragment: {shape}")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise ConfigError(f"{where} {value!r:.80} has a port out of range: {shape}") from None
    return value.rstrip("/")


def check_daemon_wait(value: object, where: str = "--daemon-wait") -> float:
    """Seconds without progress before fetch gives up on the daemon."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or not 0 < value <= _MAX_WAIT:
        raise ConfigError(f"{where} must be above 0 and at most {_MAX_WAIT:g} s, not {value}")
    return float(value)


def add_arguments(
    parser: argparse.ArgumentParser, *, wait: bool = True, daemon: str | None = None
) -> None:
    """``aioloader fetch``'s flags of the daemon (settings.FETCH, and the daemon's token);
    ``wait=False``: without ``--daemon-wait``; ``daemon``: ``--daemon``'s help instead."""
    group = parser.add_argument_group("through the node's daemon" if wait else "the daemon")
    for row in FETCH if wait else (_URL_ROW,):
        shown = daemon if daemon is not None and row is _URL_ROW else row.help
        group.add_argument(row.flag, help=f"{shown} [{row.variable}]", dest=row.dest)
    group.add_argument(
        _TOKEN_ROW.flag,
        dest=_TOKEN_ROW.dest,
        help=f"the daemon's bearer token (prefer the variable) [{_TOKEN_ROW.variable}]",
    )
    group.add_argument(
        _TOKEN_FILE_ROW.flag,
        dest=_TOKEN_FILE_ROW.dest,
        help="a file holding the daemon's bearer token (a mounted Secret); instead of "
        f"{_TOKEN_ROW.flag} [{_TOKEN_FILE_ROW.variable}]",
    )


def from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """``copy_folder``'s daemon keywords from the flags, else the environment; {} when no
    daemon is named (fetch then downloads the model itself)."""
    url, where = resolve_where(_URL_ROW, getattr(args, _URL_ROW.dest), environ)
    if url is None:
        return {}
    url = check_daemon_url(url, where or _URL_ROW.flag)
    token = _token(args, environ)
    given = getattr(args, _WAIT_ROW.dest)
    if given is not None:
        try:
            given = float(given)
        except ValueError:
            raise ConfigError(
                f"{_WAIT_ROW.flag} {given!r:.80} is not a number of seconds"
            ) from None
    wait, where = resolve_where(_WAIT_ROW, given, environ)
    wait = check_daemon_wait(wait, where or _WAIT_ROW.flag)
    return {"daemon": url, "token": token, "daemon_wait": wait}


def daemon_of(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> tuple[str | None, str | None]:
    """The daemon's URL, checked (None: none named), and its token (None: none), from
    the flags, else the environment (``add_arguments(wait=False)``'s)."""
    url, where = resolve_where(_URL_ROW, getattr(args, _URL_ROW.dest), environ)
    if url is None:
        return None, None
    return check_daemon_url(url, where or _URL_ROW.flag), _token(args, environ)


def _token(args: argparse.Namespace, environ: dict[str, str] | None) -> str | None:
    """The daemon's token from ``--token``, ``--token-file`` or their variables."""
    token, token_where = resolve_where(_TOKEN_ROW, getattr(args, _TOKEN_ROW.dest), environ)
    path, path_where = resolve_where(_TOKEN_FILE_ROW, getattr(args, _TOKEN_FILE_ROW.dest), environ)
    if path is not None:
        # A file is read and checked as the daemon reads its own; imported here, as
        # the daemon's package is only when a token file is given.
        from ..daemon.auth import read_token, token_text

        text, given = token_text(
            token, token_where or _TOKEN_ROW.flag, str(path), path_where or _TOKEN_FILE_ROW.flag
        )
        token = read_token(text, given).value
    return token.strip() if isinstance(token, str) and token.strip() else None
