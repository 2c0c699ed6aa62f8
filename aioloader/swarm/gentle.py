"""Gentle with the origin: a puller's share of the cluster's cap on requests in flight,
and the throttling answers the other nodes got, heeded here.

A CDN that throttles a greedy client throttles the cluster behind it as one (the Hub's
drops a client that ramps up to a trickle for minutes). So each node publishes its
cap (``--swarm-origin-requests``) in its manifests, the lowest of a split holds, and
the pullers share it out (deal.py): ``leading`` gives a puller's fetch its part. And a
throttling answer (429, 503) to one node slows every node: each manifest lists the
answers its node got per origin (runtime/throttle.py ``Origin``), and a node that reads
a count grown since its last look pauses its own requests to that origin for what is
left of the pause (a minute at most) and halves them (``Heard``).
"""

from __future__ import annotations

from dataclasses import replace

from ..redact import redacting_logger
from ..runtime.throttle import origin
from ..settings.options import LoadOptions
from ..settings.values import Limits
from .manifest import Throttled

__all__ = ["LEAD_CHUNK", "Heard", "leading"]

logger = redacting_logger(__name__)

LEAD_CHUNK = 8 << 20  # the largest origin read of a node that pulls files (``leading``)


def leading(options: LoadOptions, share: int | None) -> LoadOptions:
    """A puller's fetch: it reads the origin in ranges of ``LEAD_CHUNK`` bytes at most, so
    that its reads in flight span fewer files, and its first files commit, and reach the
    followers, sooner (16 reads of 16 MiB spanned two 128 MiB shards); and it has
    ``share`` requests in flight at most, its part of the cluster's cap (deal.py)."""
    limits = options.limits or Limits()
    limits = replace(limits, chunk_size=min(limits.chunk_size, LEAD_CHUNK))
    if share is not None:
        limits = replace(limits, concurrency=min(limits.concurrency, share))
    return replace(options, limits=limits)


class Heard:
    """The throttling answers the peers' manifests told of, heeded once each."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], int] = {}  # (node, origin) -> its count heeded

    def heed(self, node: str, throttled: tuple[Throttled, ...]) -> None:
        """Slow this node's requests to the origins that throttled ``node`` since its
        last answer: a pause of what it has left (capped) and a halving, once per count
        grown. A peer's first count is where it stands, unless its pause still runs."""
        for got in throttled:
            seen = self._seen.get((node, got.origin))
            self._seen[(node, got.origin)] = got.count
            if (seen is None and got.resume_in > 0) or (seen is not None and got.count > seen):
                logger.info(
                    "node %s was throttled by %s (%d so far): slowing down for %.1f s",
                    node[:8], got.origin, got.count, got.resume_in,
                )  # fmt: skip
                origin(got.origin).told(got.resume_in)
