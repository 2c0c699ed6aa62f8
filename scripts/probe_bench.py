"""How fast the daemon's probes answer, with an empty cache and with a big one.

Starts the real ``aioloader serve`` (the test rig's Daemon and HTTP server), fills
its cache folder with fake complete entries, keeps one model ready and one
download in flight (stalled by the server), then fires concurrent ``GET /ready``
and prints latency percentiles side by side, per cache size::

    python scripts/probe_bench.py                      # 0 and 3000 entries, 200 probes
    python scripts/probe_bench.py --entries 0 10000 --probes 500 --rounds 5

The target (issue 10, item 7): p99 under 100 ms with 3000 entries and 200
concurrent probes during a download, and no growth with the entry count. The
tests check the property behind it (probes read no cache file); timing lives here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_helpers import fake_entries, running, single_file
from tests.servers import FaultyHttpServer


async def _probe_round(port: int, probes: int) -> list[float]:
    """One burst of ``probes`` concurrent probes, each on a new connection as kubelet's.

    A bare asyncio client rather than aiohttp's: the client shares the machine with
    the daemon, and the less CPU it takes the more the numbers are the daemon's.
    """
    request = b"GET /ready HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"

    async def one() -> float:
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            answer = await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()
        assert answer.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")), answer[:80]
        return time.perf_counter() - started

    return list(await asyncio.gather(*(one() for _ in range(probes))))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(entries: int, probes: int, rounds: int) -> list[float]:
    """Latencies of ``rounds`` bursts of ``probes`` concurrent /ready calls, in seconds."""
    with tempfile.TemporaryDirectory(prefix="aioloader-probe-bench-") as tmp:
        folder = Path(tmp)
        (folder / "www").mkdir()
        fake_entries(folder / "cache", entries)
        with FaultyHttpServer(folder / "www") as server:
            single_file(server.root / "held.safetensors", kib=64)
            single_file(server.root / "slow.safetensors", kib=1024, seed=1)
            server.stall("slow.safetensors", 0.0)
            server.stall("slow.safetensors", 600, after_bytes=64 * 1024)
            with running(folder / "cache", "--model", server.url_for("held.safetensors")) as d:
                d.wait_ready(60)
                d.post({"url": server.url_for("slow.safetensors"), "id": "slow"})
                d.wait_for(lambda: server.in_flight >= 1, 30, "the download in flight")
                latencies: list[float] = []
                for _ in range(rounds):
                    latencies += asyncio.run(_probe_round(d.port, probes))
                status = d.model("slow")["status"]
                if status != "downloading":  # the probes outlasted the stalled download
                    print(f"note: the download was {status} by the end", file=sys.stderr)
                d.stop()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[0, 3000])
    parser.add_argument("--probes", type=int, default=200, help="concurrent probes per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.rounds} rounds of {args.probes} concurrent GET /ready, one download in flight")
    print(f"{'entries':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99 / first':>12}")
    first = None
    for entries in args.entries:
        latencies = measure(entries, args.probes, args.rounds)
        p99 = _percentile(latencies, 0.99)
        first = first or p99
        print(
            f"{entries:>8} {statistics.median(latencies) * 1e3:>8.1f} {p99 * 1e3:>8.1f} "
            f"{max(latencies) * 1e3:>8.1f} {p99 / first:>12.2f}"
        )


if __name__ == "__main__":
    main()
