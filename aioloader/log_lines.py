"""The command line's log lines: ``LEVEL logger: message`` on stderr, and a daemon's
(``aioloader serve``) start with the time, UTC to the millisecond, by which an operator
lines up the logs of a cluster's nodes (``2026-12-06T18:40:01.123Z INFO ...``)."""

from __future__ import annotations

import logging
import time

__all__ = ["configure"]

_FORMAT = "%(levelname)s %(name)s: %(message)s"


def configure(level: int, stamped: bool) -> None:
    """A handler to stderr on the root logger, at ``level``; the time first if ``stamped``."""
    formatter = logging.Formatter(
        ("%(asctime)s.%(msecs)03dZ " if stamped else "") + _FORMAT, "%Y-%m-%dT%H:%M:%S"
    )
    formatter.converter = time.gmtime
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler])
