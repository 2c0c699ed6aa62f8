"""Probes answer from memory: their cost follows the work, not the size of the cache.

The timing itself (p99 of 200 concurrent probes with 3000 entries, under 100 ms) is
measured by ``scripts/probe_bench.py``; this test checks the property that makes it
hold whatever the machine: while probes are served, the daemon reads no file of the
cache. It counts the daemon's read system calls (``/proc/<pid>/io``): a probe that
looked at each entry would make thousands, one that answers from memory a handful
(reading its request from the socket).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .daemon_helpers import fake_entries, read_syscalls, running, single_file
from .servers import FaultyHttpServer

pytest.importorskip("prometheus_client")

ENTRIES = 3000
PROBES = 200
# Reads a probe may cost: its request from the socket, and slack for the daemon's own
# work meanwhile. Reading the cache would cost at least one per entry.
READS_PER_PROBE = 20


def test_probes_read_no_cache_file(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fake_entries(cache, ENTRIES)
    single_file(http_server.root / "held.safetensors", kib=64)
    single_file(http_server.root / "slow.safetensors", kib=1024, seed=1)
    http_server.stall("slow.safetensors", 0.0)  # the first GET (the probe) passes
    http_server.stall("slow.safetensors", 60, after_bytes=64 * 1024)  # the rest hangs
    with running(cache, "--model", http_server.url_for("held.safetensors")) as daemon:
        daemon.wait_ready()
        body = {"url": http_server.url_for("slow.safetensors"), "id": "slow"}
        assert daemon.post(body)[0] == 202
        daemon.wait_for(lambda: http_server.in_flight >= 1, 10, "the download in flight")
        assert daemon.proc is not None
        before = read_syscalls(daemon.proc.pid)
        if before is None:
            pytest.skip("needs /proc/<pid>/io (Linux task I/O accounting)")
        paths = ["/ready"] * PROBES + ["/v1/models", "/v1/models/slow", "/ready?model=slow"] * 10
        with ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda path: daemon.get(path)[0], paths))
        reads = read_syscalls(daemon.proc.pid)
        assert reads is not None
        # /ready is the preload's (ready); the slow model, added through the API, is not.
        assert answers.count(200) == PROBES + 20 and answers.count(503) == 10
        assert reads - before < READS_PER_PROBE * len(paths), (reads - before, len(paths))
        assert daemon.model("slow")["status"] == "downloading"
        assert daemon.stop() == 0
