"""How many bytes a fleet of daemons pulls from the origin, and how long its nodes take.

    python scripts/fleet_bench.py --nodes 8 --size-mib 1024            # the issue's run
    python scripts/fleet_bench.py --nodes 16 32 --scenarios cold --max-minutes 30
    python scripts/fleet_bench.py --nodes 3 --size-mib 64 --no-swarm   # today's daemon

N real ``aioloader serve`` daemons (tests/fleet.py) and one origin that counts the
body bytes it serves. As root, where ``ip netns`` works, each node lives in a network
namespace of its own, its link to a bridge shaped with ``tc`` at ``--rate-mb`` MB/s
each way, and the origin sits on the bridge (scripts/fleet_netns.py); elsewhere the
nodes share loopback (127.0.0.x) and the rate reaches only what each daemon pulls from
the origin (``--max-bandwidth``). With the swarm the daemons get ``--peers`` naming
each other; ``--no-swarm`` measures today's daemon: one origin copy per node.

``--nodes`` takes several counts (8 16 32): each gets a rig of its own, run after the
other. Without ``--rate-mb`` each link gets 40 MB/s, or 320 MB/s shared among the
links where there are more than 8 (16 nodes: 20, 32 nodes: 10), so that two vCPUs
still carry every byte (the idle % printed per scenario says whether they did).

Scenarios, each timed per node from the POST to the node's ``finished`` time:
  single       one node alone: the time every other is compared with
  cold         every node asks at once, caches empty
  join         a quarter of the nodes (at least one) restart with empty caches and
               ask while the others hold the model
  leader-kill  caches empty, every node asks, and once the origin has sent half the
               model the node it sent most to (node 0 without the swarm) is killed
  cold-1file   cold, a model of one safetensors file (its URL asked, no index)
  cold-3shard  cold, a model of three shards and its index
After each one every node's cache entries are compared with the origin's files.
Each row: the origin's body bytes over the model's size, how many nodes the origin sent
body bytes to (links; by client address, so namespaces only), the nodes' times as
multiples of S/B (the model's size over a node's link rate: the time no node can
beat) at p50 and p99, the slowest time and its multiple of the single node's, and the
CPUs' idle % (mean and lowest second, from /proc/stat) while the scenario ran.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from fleet_netns import Loopback, Namespaces, namespaces_work  # noqa: E402
from fleet_report import TARGETS, CpuSampler, rate_for, summary, table  # noqa: E402

from tests.fleet import Fleet, Model, Origin, swarm_missing, write_model  # noqa: E402

MODEL_ID = "bench"
# Bytes per second a run moves through cache writes and checks in all, on two vCPUs
# (8 nodes x 128 MiB without the swarm moved about 120 MB/s into the caches, the
# check reads faster): the feasibility check's only constant.
_MOVED_PER_SECOND = 200e6
# The scenarios of a model other than --shards': (folder, shards, ask the file itself).
VARIANTS = {"cold-1file": ("model-1file", 1, True), "cold-3shard": ("model-3shard", 3, False)}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[8], help="node counts (8 16 32)")
    p.add_argument("--size-mib", type=int, default=1024, help="model size (default 1024)")
    p.add_argument("--shards", type=int, default=8, help="safetensors files (default 8)")
    p.add_argument(
        "--rate-mb", type=float,
        help="MB/s per node link, 0: none (default: 40, or 320 shared by more than 8 nodes)",
    )  # fmt: skip
    p.add_argument(
        "--scenarios",
        default="cold,join,leader-kill",
        help=", ".join(t for t in TARGETS if t != "single"),
    )
    p.add_argument("--no-swarm", action="store_true", help="no --peers: today's daemon")
    p.add_argument("--netns", choices=("auto", "on", "off"), default="auto")
    p.add_argument(
        "--mtu", type=int, default=1500,
        help="the namespaces' links' MTU (default 1500; 9001: EC2 inside a VPC)",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=float, help="seconds per scenario (default: 300, or 4 S/B if more)"
    )
    p.add_argument("--max-minutes", type=float, default=10, help="refuse longer runs")
    p.add_argument("--workdir", type=Path, help="where the model and caches go (a temp dir)")
    p.add_argument("--keep-logs", type=Path, help="copy every daemon's log here per scenario")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--daemon-args", default="",
        help="more arguments for every swarm daemon, e.g. \"--swarm-rate 1.8MB/s\"",
    )  # fmt: skip
    args = p.parse_args(argv)
    bad = set(args.scenarios.split(",")) - {""} - (set(TARGETS) - {"single"})
    if bad or min(args.nodes) < 2 or args.size_mib < 1 or args.shards < 1:
        p.error(f"--nodes >= 2, --size-mib >= 1, --shards >= 1; unknown scenarios: {bad or ''}")
    if not 1280 <= args.mtu <= 65535:
        p.error(f"--mtu {args.mtu} is not from 1280 to 65535")
    return args


def _rate_mb(args: argparse.Namespace, n: int) -> float:
    return float(args.rate_mb) if args.rate_mb is not None else rate_for(n)


def _feasible(args: argparse.Namespace, work: Path) -> str | None:
    """Why this run cannot finish here (disk, or 10 minutes at the rate), or None."""
    size = args.size_mib << 20
    scenarios = [s for s in args.scenarios.split(",") if s]
    # Each fleet's caches go once the next one starts; the origin holds every model.
    copies = max(args.nodes) + 2 + len(set(scenarios) & set(VARIANTS))
    need = size * copies
    free = shutil.disk_usage(work).free
    if need > free:
        fit = max(1, free // copies >> 20) // 2
        return f"needs {need >> 30} GiB of disk, {free >> 30} GiB free: try --size-mib {fit}"
    guess = 0.0
    for n in args.nodes:
        rate = _rate_mb(args, n)
        if not rate:
            continue
        one = size / (rate * 1e6)  # a node's time at the rate of its link
        # Every node of a run writes the whole model to its cache (and the run reads it
        # back to compare): the CPUs and disk move about _MOVED_PER_SECOND in all.
        each = max(one, size * n * 2 / _MOVED_PER_SECOND)
        guess += one + len(scenarios) * each
    if guess > args.max_minutes * 60:
        fit = int(args.size_mib * args.max_minutes * 60 / guess)
        return (
            f"a single node, then {args.scenarios} on {args.nodes} nodes would take about "
            f"{guess / 60:.0f} minutes here: try --size-mib {fit}, fewer --scenarios or "
            f"--max-minutes {guess / 60 + 1:.0f}"
        )
    return None


def _variant(origin: Path, main: Model, name: str, size: int) -> tuple[Model, Path]:
    """The model of scenario ``name`` (written once) and the file whose URL is asked."""
    if name not in VARIANTS:
        return main, main.index
    folder, shards, one_file = VARIANTS[name]
    if not (origin / folder).is_dir():
        write_model(origin / folder, size, shards)
    index = origin / folder / "model.safetensors.index.json"
    paths = tuple(sorted((origin / folder).glob("*.safetensors")))
    if one_file:
        return Model(origin / folder, paths[0], ()), paths[0]
    return Model(origin / folder, index, paths), index


def _pids(fleet: Fleet) -> Callable[[], list[int]]:
    """The fleet's daemons running now (their CPU is counted per scenario)."""
    return lambda: [n.proc.pid for n in fleet.nodes if n.proc is not None and n.alive]


class Bench:
    """One rig: ``n`` nodes on ``net`` at ``rate`` bytes/s per link, one origin."""

    def __init__(self, args: argparse.Namespace, net: Any, work: Path, model: Model) -> None:
        self.args = args
        self.net = net
        self.n = net.n
        self.rate = net.rate
        self.work = work
        self.model = model
        self.origin = Origin(work / "origin", host=net.origin_host).start()
        self.fleet: Fleet | None = None
        self.fleet_model: Model | None = None  # what the running fleet's cold start asked
        self.rounds = 0
        self.use(model, model.index)
        floor = model.size / self.rate if self.rate else 0
        self.timeout = args.timeout or max(300.0, 4 * floor)

    def use(self, model: Model, asked: Path) -> None:
        """Ask for ``model`` from now on, by the URL of ``asked`` (its index or file)."""
        self.current = model
        self.url = self.origin.url_for(model.relpath(asked, self.origin.root))

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        self.origin.stop()

    def _fleet(self, n: int, swarm: bool) -> Fleet:
        if self.fleet is not None:
            self.fleet.close()
            shutil.rmtree(self.fleet.root, ignore_errors=True)  # 32 caches of a GiB each
        self.rounds += 1
        root = self.work / f"fleet{self.n}-{self.rounds}"
        self.fleet = Fleet(
            n, root, swarm=swarm,
            args=[*self.net.daemon_args(), *(shlex.split(self.args.daemon_args) if swarm else [])],
            host_of=self.net.host_of, wrap=self.net.wrap, ports=self.net.ports,
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

    def _wait(self, fleet: Fleet, which: list[int]) -> tuple[dict[int, Any], list[str]]:
        """Each node's record once ready, until the timeout; and why the others are not."""
        records: dict[int, Any] = {}
        why: dict[int, str] = {}
        deadline = time.monotonic() + self.timeout
        pending = list(which)
        while pending and time.monotonic() < deadline:
            for i in list(pending):
                if not fleet[i].alive:
                    why[i] = f"node {i} exited ({fleet[i].proc.returncode})"  # type: ignore[union-attr]
                    pending.remove(i)
                    continue
                try:
                    record = fleet[i].model(MODEL_ID)
                except (OSError, AssertionError) as exc:
                    why[i] = f"node {i}: {exc}"
                    continue
                if record["status"] == "ready":
                    records[i] = record
                    why.pop(i, None)
                    pending.remove(i)
                elif record["status"] == "failed":
                    why[i] = f"node {i} failed: {record.get('error')}"
                    pending.remove(i)
                else:
                    why[i] = (
                        f"node {i} {record['status']} after {self.timeout:.0f} s, "
                        f"{record.get('bytes_done')} bytes done"
                    )
            time.sleep(0.5)
        failures = [why[i] for i in which if i not in records]
        if self.args.keep_logs is None:  # else the logs are kept whole
            for i in which:
                if i not in records:
                    tail = fleet[i].output().strip().splitlines()[-2:]
                    failures.append(f"node {i} log: {' | '.join(tail)[-400:]}")
        return records, failures

    def _finish(
        self, fleet: Fleet, asked: dict[int, float], which: list[int], name: str, cpu: CpuSampler
    ) -> dict[str, Any]:
        records, failures = self._wait(fleet, which)
        cpu.stop()
        times: dict[int, float | None] = {
            i: round(records[i]["finished"] - asked[i], 2) if i in records else None for i in which
        }
        model = self.current
        wrong = [w for i in records for w in fleet.mismatches(i, model, self.origin, False)]
        origin = self.origin.bytes_total
        by_node: dict[int | str, int] = {}
        requests: dict[int | str, int] = {}
        for client, nbytes in self.origin.bytes_by_client().items():
            if nbytes > 0:
                by_node[self._node_key(client)] = nbytes
        for served in self.origin.served:
            key = self._node_key(served.client)
            requests[key] = requests.get(key, 0) + 1
        done = [t for t in times.values() if t is not None]
        result = {
            "scenario": name,
            "nodes": len(which),
            "rate_mb": self.rate / 1e6,
            "model_bytes": model.size,
            "files": len(model.files),
            "origin_bytes": origin,
            "origin_ratio": round(origin / model.size, 3),
            # Distinct node addresses the origin sent body bytes to (namespaces only:
            # on loopback every node arrives from 127.0.0.1).
            "origin_links": len(by_node) if self.net.kind == "netns" else None,
            "origin_by_node": by_node,
            "origin_requests_by_node": requests,
            "times": times,
            "slowest": max(done) if len(done) == len(times) else None,
            **summary(times, model.size, self.rate),
            "cpu": cpu.result(),
            "bit_identical": not wrong and not failures,
            "mismatches": wrong[:10],
            "failures": failures,
        }
        self._keep_logs(fleet, name)
        return result

    def _node_key(self, client: str) -> int | str:
        node = self.net.node_of_client(client)
        return client if node is None else node

    def _keep_logs(self, fleet: Fleet, name: str) -> None:
        if self.args.keep_logs is None:
            return
        self.args.keep_logs.mkdir(parents=True, exist_ok=True)
        for node in fleet.nodes:
            if node.log.exists():
                shutil.copy(
                    node.log, self.args.keep_logs / f"{self.n}n-{name}-node{node.index}.log"
                )

    def single(self) -> dict[str, Any]:
        fleet = self._fleet(1, swarm=False)
        self.origin.reset_counters()
        cpu = CpuSampler(pids=_pids(fleet)).__enter__()
        return self._finish(fleet, self._ask(fleet, [0]), [0], "single", cpu)

    def cold(self, name: str = "cold") -> dict[str, Any]:
        fleet = self._fleet(self.n, swarm=not self.args.no_swarm)
        self.fleet_model = self.current
        self.origin.reset_counters()
        every = list(range(len(fleet)))
        cpu = CpuSampler(pids=_pids(fleet)).__enter__()
        return self._finish(fleet, self._ask(fleet, every), every, name, cpu)

    def join(self) -> dict[str, Any]:
        fleet = self.fleet
        if (
            fleet is None or len(fleet) != self.n or self.fleet_model is not self.model
            or not all(n.alive for n in fleet.nodes)
        ):  # fmt: skip
            self.use(self.model, self.model.index)
            self.cold()  # the others must hold the model first
            fleet = self.fleet
        assert fleet is not None
        joiners = list(range(len(fleet) - max(1, len(fleet) // 4), len(fleet)))
        for i in joiners:
            fleet.stop(i)
            fleet.wipe(i)
        fleet.start(*joiners)
        self.origin.reset_counters()
        cpu = CpuSampler(pids=_pids(fleet)).__enter__()
        return self._finish(fleet, self._ask(fleet, joiners), joiners, "join", cpu)

    def leader_kill(self) -> dict[str, Any]:
        fleet = self._fleet(self.n, swarm=not self.args.no_swarm)
        self.origin.reset_counters()
        every = list(range(len(fleet)))
        cpu = CpuSampler(pids=_pids(fleet)).__enter__()
        asked = self._ask(fleet, every)
        deadline = time.monotonic() + self.timeout
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
        result = self._finish(fleet, asked, survivors, "leader-kill", cpu)
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

    def run(self, name: str) -> dict[str, Any]:
        if name in VARIANTS:
            self.use(*_variant(self.origin.root, self.model, name, self.args.size_mib << 20))
            return self.cold(name)
        self.use(self.model, self.model.index)
        return {"cold": self.cold, "join": self.join, "leader-kill": self.leader_kill}[name]()


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends the run the way Ctrl-C does, through every cleanup of ``main``."""
    raise KeyboardInterrupt


def _one(
    args: argparse.Namespace, n: int, work: Path, model: Model, why_not: str | None,
    singles: dict[float, dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """A single node (once per rate), then the scenarios, on a rig of ``n`` nodes."""
    rate_mb = _rate_mb(args, n)
    rate = int(rate_mb * 1e6)
    started = time.monotonic()
    net: Any = None
    bench = None
    try:
        net = Namespaces(n, rate, args.mtu) if not why_not else Loopback(n, rate)
        bench = Bench(args, net, work, model)
        if rate_mb not in singles:
            singles[rate_mb] = bench.single()
        results = [singles[rate_mb]]
        for name in filter(None, args.scenarios.split(",")):
            results.append(bench.run(name))
            if not args.json:
                print(f"  {n} nodes: {name} done in {results[-1]['slowest']} s", file=sys.stderr)
    finally:
        if bench is not None:
            bench.close()
            if bench.fleet is not None:
                shutil.rmtree(bench.fleet.root, ignore_errors=True)
        if net is not None:
            net.close()
    single = results[0]["slowest"]
    return {
        "nodes": n,
        "model_bytes": model.size,
        "shards": args.shards,
        "rate_mb": rate_mb,
        "swarm": not args.no_swarm,
        "network": net.describe(),
        "network_fallback_reason": why_not,
        "total_s": round(time.monotonic() - started, 1),
        "single_s": single,
        "results": results,
    }


def _print(report: dict[str, Any]) -> None:
    why_not = report["network_fallback_reason"]
    print(
        f"{report['nodes']} nodes, model {report['model_bytes'] / 2**20:.0f} MiB in "
        f"{report['shards']} shards, "
        f"{'swarm' if report['swarm'] else 'no swarm (every node from the origin)'}, "
        f"{report['network']}" + (f" (no namespaces: {why_not})" if why_not else "")
    )
    single = report["single_s"] or 0
    print(table(report["results"], single, report["model_bytes"]))
    print(f"single-node time {single:.1f} s; this fleet's run {report['total_s']:.0f} s\n")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if not args.no_swarm and (why := swarm_missing()):
        print(f"fleet_bench: the swarm is not available ({why}); run with --no-swarm to "
              "measure today's daemon", file=sys.stderr)  # fmt: skip
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if why := _feasible(args, work):
        print(f"fleet_bench: cannot finish here in {args.max_minutes:g} minutes: {why}",
              file=sys.stderr)  # fmt: skip
        return 2
    why_not = namespaces_work() if args.netns != "off" else "--netns off"
    if args.netns == "on" and why_not:
        print(f"fleet_bench: network namespaces unavailable: {why_not}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    reports = []
    singles: dict[float, dict[str, Any]] = {}
    try:
        t0 = time.monotonic()
        model = write_model(work / "origin" / "model", args.size_mib << 20, args.shards)
        made = time.monotonic() - t0
        for n in args.nodes:
            reports.append(_one(args, n, work, model, why_not, singles))
            reports[-1]["model_written_s"] = round(made, 1)
            if not args.json:
                _print(reports[-1])
    except KeyboardInterrupt:
        print("fleet_bench: interrupted; daemons, namespaces and files removed", file=sys.stderr)
        return 130
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    total = round(time.monotonic() - started, 1)
    if args.json:
        for report in reports:
            report["total_s"] = total if len(reports) == 1 else report["total_s"]
        print(json.dumps(reports[0] if len(reports) == 1 else {"runs": reports}, indent=1))
    else:
        print(f"whole run {total:.0f} s")
    ok = all(r["bit_identical"] for report in reports for r in report["results"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
