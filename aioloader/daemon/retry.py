"""When to try a failed preload again: capped exponential backoff with jitter (pure).

A model the daemon was started to preload (``--model``) is its reason to exist:
one upstream blip at boot must not leave ``/ready`` at 503 until a restart. So a
failed preload is tried again after ``base`` seconds, then twice that, and so on
up to ``cap``, for as long as the daemon runs, until it succeeds or the model is
removed (``DELETE /v1/models/{id}``). Each delay is drawn from its upper half
("equal jitter"), so the daemons of a whole cluster, which failed together when
the store went away, do not all come back to it in the same instant.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ..settings.values import MAX_SECONDS, check_number

__all__ = ["DEFAULT_RETRY_BACKOFF", "DEFAULT_RETRY_BACKOFF_MAX", "Backoff"]

DEFAULT_RETRY_BACKOFF = 1.0
"""Seconds before the first retry of a failed preload."""
DEFAULT_RETRY_BACKOFF_MAX = 300.0
"""The longest wait between two tries of a failed preload."""

_DOUBLINGS = 60  # beyond this the cap has long been reached (2**60 * any base)


@dataclass(frozen=True)
class Backoff:
    """Delays between the tries of a failed preload.

    Args:
        base: seconds before the first retry; doubles after each failure.
        cap: the longest delay, jitter included.
    """

    base: float = DEFAULT_RETRY_BACKOFF
    cap: float = DEFAULT_RETRY_BACKOFF_MAX

    def __post_init__(self) -> None:
        check_number("retry backoff", self.base, positive=True, maximum=MAX_SECONDS)
        check_number("retry backoff max", self.cap, positive=True, maximum=MAX_SECONDS)
        if self.cap < self.base:
            raise ConfigError(
                f"retry backoff max ({self.cap:g} s) must not be below retry backoff "
                f"({self.base:g} s)"
            )

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1 for the first)."""
        ceiling = min(self.cap, self.base * 2.0 ** min(max(failures, 1) - 1, _DOUBLINGS))
        return ceiling / 2 + ceiling / 2 * rand()
