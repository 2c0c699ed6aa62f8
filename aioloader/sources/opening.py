"""How much of a remote file the request that opens it reads: ``probe_size()``.

Opening a file over HTTP (and S3, GCS, Azure, the Hub) is one range GET of its
first ``PROBE_SIZE`` bytes: its size, its version and, nearly always, the whole
safetensors header in one round trip (sources/http/store.py). An opener that
reads none of those bytes (a swarm puller, which reads one range far from the
start of the file, swarm/pulling.py) opens it inside ``lean()``: the probe asks
for the first byte only, so that a cluster of N pullers of one file does not make
the origin send N - 1 headers nobody reads (at 32 nodes and a 128 MiB file, 6 %
of the file again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["PROBE_SIZE", "lean", "probe_size"]

PROBE_SIZE = 256 * 1024
"""The first bytes of a file its opening reads (the default)."""

_PROBE: ContextVar[int] = ContextVar("aioloader_probe_size", default=PROBE_SIZE)


def probe_size() -> int:
    """How many first bytes of a file an open in this task reads."""
    return _PROBE.get()


@contextlib.contextmanager
def lean() -> Iterator[None]:
    """Opens inside read a file's first byte only (its size and version still come)."""
    token = _PROBE.set(1)
    try:
        yield
    finally:
        _PROBE.reset(token)
