"""How many bytes a fleet of daemons pulls from the origin, and how long its nodes take.

    python scripts/fleet_bench.py --nodes 8 --size-mib 1024            # the issue's run
    python scripts/fleet_bench.py --nodes 3 --size-mib 64 --no-swarm   # today's daemon

N real ``aioloader serve`` daemons (tests/fleet.py) and one origin that counts the
body bytes it serves. As root, where ``ip netns`` works, each node lives in a network
namespace of its own, its link to a bridge shaped with ``tc`` at ``--rate-mb`` MB/s
each way, and the origin sits on the bridge (scripts/fleet_netns.py); elsewhere the
nodes share loopback (127.0.0.x) and the rate reaches only what each daemon pulls from
the origin (``--max-bandwidth``). With the swarm the daemons get ``--peers`` naming
each other; ``--no-swarm`` measures today's daemon: one origin copy per node.

Scenarios, each timed per node from the POST to the node's ``finished`` time:
  single       one node alone: the time every other is compared with
  cold         every node asks at once, caches empty
  join         a quarter of the nodes (at least one) restart with empty caches and
               ask while the others hold the model
  leader-kill  caches empty, every node asks, and once the origin has sent half the
               model the node it sent most to (node 0 without the swarm) is killed
After each one every node's cache entries are compared with the origin's files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from fleet_netns import Loopback, Namespaces, namespaces_work  # noqa: E402

from tests.fleet import Fleet, Model, Origin, swarm_missing, write_model  # noqa: E402

MODEL_ID = "bench"
# Bytes per second a run moves through cache writes and checks in all, on two vCPUs
# (8 nodes x 128 MiB without the swarm moved about 120 MB/s into the caches, the
# check reads faster): the feasibility check's only constant.
_MOVED_PER_SECOND = 200e6
TARGETS = {
    "cold": "origin <= 1.05x, slowest <= 2.0x single (stretch 1.5x)",
    "join": "origin 0 bytes, slowest <= 1.3x single",
    "leader-kill": "every survivor done, origin <= 2x",
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--size-mib", type=int, default=1024, help="model size (default 1024)")
    p.add_argument("--shards", type=int, default=8, help="safetensors files (default 8)")
    p.add_argument("--rate-mb", type=float, default=40, help="MB/s per node link, 0: none")
    p.add_argument("--scenarios", default="cold,join,leader-kill")
    p.add_argument("--no-swarm", action="store_true", help="no --peers: today's daemon")
    p.add_argument("--netns", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--timeout", type=float, default=300, help="seconds per scenario")
    p.add_argument("--workdir", type=Path, help="where the model and caches go (a temp dir)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    bad = set(args.scenarios.split(",")) - set(TARGETS)
    if bad or args.nodes < 2 or args.size_mib < 1 or args.shards < 1:
        p.error(f"--nodes >= 2, --size-mib >= 1, --shards >= 1; unknown scenarios: {bad or ''}")
    return args


def _feasible(args: argparse.Namespace, work: Path) -> str | None:
    """Why this run cannot finish here (disk, or 10 minutes at the rate), or None."""
    size = args.size_mib << 20
    need = size * (args.nodes + 2)
    free = shutil.disk_usage(work).free
    if need > free:
        fit = max(1, free // (args.nodes + 2) >> 20) // 2
        return f"needs {need >> 30} GiB of disk, {free >> 30} GiB free: try --size-mib {fit}"
    if args.rate_mb:
        one = size / (args.rate_mb * 1e6)  # a node's time at the rate of its link
        runs = 1 + len(args.scenarios.split(","))
        # Every node of a run writes the whole model to its cache (and the run reads it
        # back to compare): the CPUs and disk move about _MOVED_PER_SECOND in all.
        each = max(one, size * args.nodes * 2 / _MOVED_PER_SECOND)
        guess = one + (runs - 1) * each
        if guess > 600:
            fit = int(args.size_mib * 600 / guess)
            return (
                f"{runs} runs (a single node, then {args.scenarios}) would take about "
                f"{guess / 60:.0f} minutes here: try --size-mib {fit} or fewer --scenarios"
            )
    return None


class Bench:
    def __init__(self, args: argparse.Namespace, net: Any, work: Path, model: Model) -> None:
        self.args = args
        self.net = net
        self.work = work
        self.model = model
        self.origin = Origin(work / "origin", host=net.origin_host).start()
        self.url = self.origin.url_for(model.relpath(model.index, self.origin.root))
        self.fleet: Fleet | None = None
        self.rounds = 0

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        self.origin.stop()

    def _fleet(self, n: int, swarm: bool) -> Fleet:
        if self.fleet is not None:
            self.fleet.close()
        self.rounds += 1
        root = self.work / f"fleet{self.rounds}"
        self.fleet = Fleet(
            n, root, swarm=swarm, args=self.net.daemon_args(),
            host_of=self.net.host_of, wrap=self.net.wrap,
        )  # fmt: skip
        self.fleet.start()
        return self.fleet

    def _ask(self, fleet: Fleet, which: list[int]) -> dict[int, float]:
        """POST the model to every node of ``which`` at once; when each was asked."""
        asked: dict[int, float] = {}

        def post(i: int) -> None:
            asked[i] = time.time()
            fleet.post(i, self.url, MODEL_ID)

        threads = [threading.Thread(target=post, args=(i,)) for i in which]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return asked

    def _finish(
        self, fleet: Fleet, asked: dict[int, float], which: list[int], name: str
    ) -> dict[str, Any]:
        records = fleet.wait_all(MODEL_ID, which, seconds=self.args.timeout)
        times = {i: round(records[i]["finished"] - asked[i], 2) for i in which}
        wrong = [w for i in which for w in fleet.mismatches(i, self.model, self.origin, False)]
        origin = self.origin.bytes_total
        return {
            "scenario": name,
            "nodes": len(which),
            "origin_bytes": origin,
            "origin_ratio": round(origin / self.model.size, 3),
            "times": times,
            "slowest": max(times.values()),
            "bit_identical": not wrong,
            "mismatches": wrong[:10],
        }

    def single(self) -> dict[str, Any]:
        fleet = self._fleet(1, swarm=False)
        self.origin.reset_counters()
        return self._finish(fleet, self._ask(fleet, [0]), [0], "single")

    def cold(self) -> dict[str, Any]:
        fleet = self._fleet(self.args.nodes, swarm=not self.args.no_swarm)
        self.origin.reset_counters()
        every = list(range(len(fleet)))
        return self._finish(fleet, self._ask(fleet, every), every, "cold")

    def join(self) -> dict[str, Any]:
        fleet = self.fleet
        if fleet is None or len(fleet) != self.args.nodes or not all(n.alive for n in fleet.nodes):
            self.cold()  # the others must hold the model first
            fleet = self.fleet
        assert fleet is not None
        joiners = list(range(len(fleet) - max(1, len(fleet) // 4), len(fleet)))
        for i in joiners:
            fleet.stop(i)
            fleet.wipe(i)
        fleet.start(*joiners)
        self.origin.reset_counters()
        return self._finish(fleet, self._ask(fleet, joiners), joiners, "join")

    def leader_kill(self) -> dict[str, Any]:
        fleet = self._fleet(self.args.nodes, swarm=not self.args.no_swarm)
        self.origin.reset_counters()
        every = list(range(len(fleet)))
        asked = self._ask(fleet, every)
        deadline = time.monotonic() + self.args.timeout
        killed = None
        while killed is None and time.monotonic() < deadline:
            leader = self._leader(fleet)
            if leader is not None:
                record = fleet[leader].model(MODEL_ID)
                if record["status"] == "ready":
                    break  # too late: it finished between two looks (the table says so)
                # The nodes split the origin's files: half of the model sent, whoever to.
                half = not self.args.no_swarm and self.origin.bytes_total >= self.model.size / 2
                if half or self._pulled(leader, record) >= self.model.size / 2:
                    fleet.kill(leader)
                    killed = leader
            time.sleep(0.02)
        survivors = [i for i in every if i != killed]
        result = self._finish(fleet, asked, survivors, "leader-kill")
        result["killed"] = killed
        return result

    def _pulled(self, i: int, record: dict[str, Any]) -> int:
        """How much of the model node ``i`` holds: what the origin sent it where nodes
        have addresses of their own, else what its record says (file by file)."""
        if self.net.kind == "netns":
            return self.origin.bytes_by_client().get(self.net.host_of(i), 0)  # type: ignore[no-any-return]
        return max(record.get("bytes_done") or 0, record.get("bytes_from_origin") or 0)

    def _leader(self, fleet: Fleet) -> int | None:
        """The node pulling from the origin: by client address where nodes have their
        own, else by the nodes' own counts, else node 0."""
        by_client = self.origin.bytes_by_client()
        if by_client and self.net.kind == "netns":
            address = max(by_client, key=lambda a: by_client[a])
            return self.net.node_of_client(address)  # type: ignore[no-any-return]
        if self.origin.bytes_total == 0:
            return None
        counts = {i: fleet[i].model(MODEL_ID).get("bytes_from_origin") for i in range(len(fleet))}
        if all(isinstance(c, int) for c in counts.values()):
            return max(counts, key=lambda i: counts[i] or 0)
        return 0


def _table(results: list[dict[str, Any]], single: float) -> str:
    lines = [
        f"{'scenario':<12} {'nodes':>5} {'origin/model':>12} {'slowest s':>9} "
        f"{'x single':>8} {'identical':>9}  target",
    ]
    for r in results:
        ratio = r["slowest"] / single if single else float("nan")
        lines.append(
            f"{r['scenario']:<12} {r['nodes']:>5} {r['origin_ratio']:>11.3f}x "
            f"{r['slowest']:>9.1f} {ratio:>8.2f} {'yes' if r['bit_identical'] else 'NO':>9}  "
            f"{TARGETS.get(r['scenario'], 'the baseline')}"
        )
    lines.append("")
    for r in results:
        per_node = " ".join(f"{i}:{t:.1f}" for i, t in sorted(r["times"].items()))
        killed = ""
        if "killed" in r:
            killed = (
                f" (node {r['killed']} killed)"
                if r["killed"] is not None
                else " (none killed: done first)"
            )
        lines.append(f"{r['scenario']}{killed}: node:seconds {per_node}")
    return "\n".join(lines)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends the run the way Ctrl-C does, through every cleanup of ``main``."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if not args.no_swarm and (why := swarm_missing()):
        print(f"fleet_bench: the swarm is not available ({why}); run with --no-swarm to "
              "measure today's daemon", file=sys.stderr)  # fmt: skip
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if why := _feasible(args, work):
        print(f"fleet_bench: cannot finish here in 10 minutes: {why}", file=sys.stderr)
        return 2
    why_not = namespaces_work() if args.netns != "off" else "--netns off"
    if args.netns == "on" and why_not:
        print(f"fleet_bench: network namespaces unavailable: {why_not}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    rate = int(args.rate_mb * 1e6)
    net: Any = None
    bench = None
    started = time.monotonic()
    try:
        net = Namespaces(args.nodes, rate) if not why_not else Loopback(args.nodes, rate)
        t0 = time.monotonic()
        model = write_model(work / "origin" / "model", args.size_mib << 20, args.shards)
        made = time.monotonic() - t0
        model_bytes = model.size
        bench = Bench(args, net, work, model)
        results = [bench.single()]
        runs = {"cold": bench.cold, "join": bench.join, "leader-kill": bench.leader_kill}
        for name in args.scenarios.split(","):
            results.append(runs[name]())
    except KeyboardInterrupt:
        print("fleet_bench: interrupted; daemons, namespaces and files removed", file=sys.stderr)
        return 130
    finally:
        if bench is not None:
            bench.close()
        if net is not None:
            net.close()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    single = results[0]["slowest"]
    report = {
        "nodes": args.nodes,
        "model_bytes": model_bytes,
        "shards": args.shards,
        "rate_mb": args.rate_mb,
        "swarm": not args.no_swarm,
        "network": net.describe(),
        "network_fallback_reason": why_not,
        "model_written_s": round(made, 1),
        "total_s": round(time.monotonic() - started, 1),
        "single_s": single,
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(
            f"{args.nodes} nodes, model {model_bytes / 2**20:.0f} MiB in {args.shards} shards, "
            f"{'swarm' if report['swarm'] else 'no swarm (every node from the origin)'}, "
            f"{report['network']}" + (f" (no namespaces: {why_not})" if why_not else "")
        )
        print(_table(results, single))
        print(f"single-node time {single:.1f} s; whole run {report['total_s']:.0f} s")
    return 0 if all(r["bit_identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
