"""``AIOLOADER_*`` variables that nothing reads: a misspelt setting is said, once.

A misspelt one (``CONCURENCY`` for ``AIOLOADER_CONCURRENCY``) would otherwise be ignored
without a word and the load run with the default. The names known are those of the
tables that read them: the load options (``options.KEYWORDS``), the daemon's arguments
(``daemon/config.py``, whose help texts name each variable in brackets) and
``READ_DIRECTLY``, the few that one module reads itself (tests/test_environment.py
checks that these cover every name in the package). A warning names the variable,
never its value (it may be a secret).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import re
from collections.abc import Mapping

from .redact import redacting_logger

__all__ = ["PREFIX", "READ_DIRECTLY", "known_variables", "warn_unknown_variables"]

logger = redacting_logger(__name__)

PREFIX = "AIOLOADER_"

READ_DIRECTLY = frozenset(
    {
        "AIOLOADER_CHECK_ETAG",  # cache/model_cache.py
        "AIOLOADER_S3_ADDRESSING",  # sources/s3/signer.py
        "AIOLOADER_AZURE_IDENTITY",  # sources/azure/signer.py
    }
)
"""Variables read by one module of their own rather than through a table."""

_NAME = re.compile(r"AIOLOADER_[A-Z0-9_]*[A-Z0-9]")
_warned: set[str] = set()


def _load_variables() -> frozenset[str]:
    from .options import KEYWORDS

    return frozenset(k.variable for k in KEYWORDS if k.env) | READ_DIRECTLY


@functools.cache
def known_variables() -> frozenset[str]:
    """Every ``AIOLOADER_*`` variable aioloader reads: a load's and the daemon's."""
    from .daemon.config import add_arguments  # pure: no aiohttp, no server

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return _load_variables() | frozenset(_NAME.findall(parser.format_help()))


def warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """Log a warning for each ``AIOLOADER_*`` variable of ``environ`` that aioloader does
    not read, naming the known one closest to it; each name once per process."""
    names = [n for n in environ if n.startswith(PREFIX) and n not in _warned]
    if not names:
        return
    cheap = _load_variables()
    names = [n for n in names if n not in cheap]
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
