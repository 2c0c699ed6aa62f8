"""Pacing a fetch's network reads: the hook the daemon's bandwidth cap works through.

A fetch started while ``PACE`` holds a ``Pace`` (the daemon sets it in the task
that fetches, around ``ModelCache.fetch``, whose fetch task inherits it) takes
its bytes from it before each request that brings bytes over the network is
sent: the probe that opens a file (its first ``PROBE_SIZE`` bytes,
sources/http/store.py) and each range read (sources/http/blob.py), whose size
the fetch cuts to the pace's ``quantum`` (cache/fetch.py). Every other byte from
the origin counts too: a listing page or metadata (``HttpStore.read_body``: S3, GCS
and Azure listings, the Hub's answers), a HEAD's headers, and the bytes a stream
opened again after a failure reads to get back where it was (a retry). Bytes that
never cross the network (a file's head, kept from its probe; a file of the hub
cache) take nothing. Nothing else sets it: loads are never paced.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

__all__ = ["PACE", "Pace", "quantum", "take"]


class Pace(Protocol):
    """Paces the network reads of a fetch (the daemon's bandwidth cap)."""

    quantum: int  # the largest read to issue at once

    async def take(self, nbytes: int) -> None:
        """Return when ``nbytes`` more may be requested."""


PACE: ContextVar[Pace | None] = ContextVar("aioloader_fetch_pace", default=None)


def quantum(default: int) -> int:
    """The largest read a paced fetch issues at once; ``default`` when not paced."""
    pace = PACE.get()
    return default if pace is None else min(default, max(1, pace.quantum))


async def take(nbytes: int) -> None:
    """Wait until ``nbytes`` may be requested, if this task's fetch is paced."""
    pace = PACE.get()
    if pace is not None and nbytes > 0:
        await pace.take(nbytes)
