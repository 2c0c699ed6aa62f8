"""What scripts/fleet_bench.py measures besides time, and how it prints it.

``CpuSampler``: the machine's idle share of CPU time, sampled from /proc/stat once a
second (as ``vmstat 1``'s ``id`` column) while a scenario runs: its mean and its
lowest second, so that a reader sees whether the CPUs, not the links, set the pace.
``rate_for``: the default per-link rate for a fleet of n nodes. ``summary``: a
scenario's node times as multiples of S/B (the model's size over a node's link rate:
the time no node can beat), their p50 and p99. ``table``: the printed report.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["TARGETS", "CpuSampler", "percentile", "rate_for", "summary", "table"]

# What two vCPUs carried through the namespaces with CPU to spare: 8 nodes x 40 MB/s
# (docs/benchmarks.md: `vmstat` idle 15-40 % in the cold phase). Larger fleets get
# this aggregate split among their links, so that their daemons' own work (32
# processes, each polling its peers) still leaves the CPUs idle part of the time.
AGGREGATE_MB = 320.0
MAX_RATE_MB = 40.0

# The issue's targets (issue 44), printed beside each row.
TARGETS = {
    "single": "the baseline",
    "cold": "32 nodes: origin <= 1.02x, p50 <= 1.25x, p99 <= 1.5x S/B; "
    "8 x 40 MB/s: slowest <= 1.3x single",
    "join": "origin 0 bytes",
    "leader-kill": "killed at 50 %: origin <= 1.15x, every survivor done",
    "cold-1file": "8 nodes: >= 7 origin links, origin <= 1.02x",
    "cold-3shard": "8 nodes: >= 7 origin links, origin <= 1.02x",
}


def rate_for(nodes: int) -> float:
    """MB/s per link for ``nodes`` nodes: 40, or AGGREGATE_MB shared among them."""
    return min(MAX_RATE_MB, AGGREGATE_MB / nodes)


def _cpu_times() -> tuple[int, int, int, int, int, int]:
    """(idle, iowait, total, user, system, softirq) jiffies of all CPUs since boot,
    from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest is counted in user)
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    return idle, iowait, sum(fields[:8]), user + nice, system + irq, softirq


def _process_ticks(pids: list[int]) -> dict[int, int]:
    """utime + stime, in jiffies, of each process of ``pids`` still there."""
    ticks = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[pid] = int(fields[11]) + int(fields[12])
    return ticks


class CpuSampler:
    """``with CpuSampler() as cpu: ...``; then ``cpu.result()``: idle % (mean, min of
    the 1 s samples), iowait, user, system and softirq % (means), and with ``pids`` (the
    daemons) the CPU seconds those processes took meanwhile; None where /proc/stat is
    missing."""

    def __init__(self, every: float = 1.0, pids: Callable[[], list[int]] | None = None) -> None:
        self.every = every
        self.samples: list[tuple[float, float]] = []  # (idle %, iowait %) per interval
        self._first: tuple[int, ...] | None = None
        self._last: tuple[int, ...] | None = None
        self._pids = pids
        self._ticks: dict[int, int] = {}  # pid -> its jiffies at the start
        self._took: dict[int, int] = {}  # pid -> its jiffies since the start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CpuSampler:
        try:
            self._first = self._last = _cpu_times()
        except OSError:
            return self
        if self._pids is not None:
            self._ticks = _process_ticks(self._pids())
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take(self) -> None:
        now = _cpu_times()
        assert self._last is not None
        idle, wait, total = (a - b for a, b in zip(now[:3], self._last[:3], strict=True))
        if self._ticks:  # a daemon killed meanwhile keeps what it took until its last sample
            for pid, ticks in _process_ticks(list(self._ticks)).items():
                self._took[pid] = ticks - self._ticks[pid]
        if total > 0:
            self.samples.append((100 * idle / total, 100 * wait / total))
        self._last = now

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._take()

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._take()  # the part of a second since the last sample

    def result(self) -> dict[str, Any] | None:
        if self._first is None or self._last is None:
            return None
        idle, wait, total, user, system, softirq = (
            a - b for a, b in zip(self._last, self._first, strict=True)
        )
        if total <= 0:
            return None
        hz = os.sysconf("SC_CLK_TCK")
        return {
            "idle_mean": round(100 * idle / total, 1),
            "idle_min": round(min(s[0] for s in self.samples), 1) if self.samples else None,
            "iowait_mean": round(100 * wait / total, 1),
            "user_mean": round(100 * user / total, 1),
            "system_mean": round(100 * system / total, 1),
            "softirq_mean": round(100 * softirq / total, 1),
            "cpu_seconds": round(total / hz, 1),
            "daemon_cpu_s": round(sum(self._took.values()) / hz, 1) if self._ticks else None,
            "daemons": len(self._ticks),
            "samples": len(self.samples),
        }


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile: with fewer than 100 values, p99 is the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(times: dict[int, float | None], size: int, rate: float) -> dict[str, Any]:
    """p50/p99 seconds of the nodes that finished, and as multiples of S/B (``rate``
    in bytes/s; 0: unshaped, no S/B); None where a node did not finish."""
    done = [t for t in times.values() if t is not None]
    floor = size / rate if rate else None
    out: dict[str, Any] = {
        "s_over_b": round(floor, 2) if floor else None,
        "done": len(done),
        "p50_s": percentile(done, 50) if done else None,
        "p99_s": percentile(done, 99) if len(done) == len(times) and done else None,
    }
    for key in ("p50", "p99"):
        seconds = out[f"{key}_s"]
        out[f"{key}_x_sb"] = round(seconds / floor, 3) if floor and seconds is not None else None
    if floor:
        out["x_sb"] = {i: round(t / floor, 3) for i, t in times.items() if t is not None}
    return out


def _num(value: float | None, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}"


def table(results: list[dict[str, Any]], single: float, single_size: int) -> str:
    """The rows (one per scenario), then each scenario's nodes: seconds and x S/B."""
    head = (
        f"{'scenario':<12} {'nodes':>5} {'MB/s':>4} {'origin/model':>12} {'links':>5} "
        f"{'p50 xSB':>7} {'p99 xSB':>7} {'slowest s':>9} {'x single':>8} {'identical':>9} "
        f"{'idle% mean/min':>14}  target"
    )
    lines = [head]
    for r in results:
        # A variant's model may differ a little in size: the single time scaled to it.
        base = single * r["model_bytes"] / single_size if single and single_size else 0
        slowest = r["slowest"]
        ratio = slowest / base if base and slowest is not None else None
        cpu = r.get("cpu") or {}
        idle = (
            f"{cpu['idle_mean']:.0f}/{cpu['idle_min']:.0f}"
            if cpu.get("idle_min") is not None
            else "-"
        )
        links = r.get("origin_links")
        lines.append(
            f"{r['scenario']:<12} {r['nodes']:>5} {r['rate_mb']:>4.0f} "
            f"{r['origin_ratio']:>11.3f}x {'-' if links is None else links:>5} "
            f"{_num(r['p50_x_sb'], '.2f', 7)} {_num(r['p99_x_sb'], '.2f', 7)} "
            f"{_num(slowest, '.1f', 9)} {_num(ratio, '.2f', 8)} "
            f"{'yes' if r['bit_identical'] else 'NO':>9} {idle:>14}  "
            f"{TARGETS.get(r['scenario'], '')}"
        )
    lines.append("")
    lines.append(
        "S/B: model size / the node's link rate; p99 is the nearest rank, so with fewer "
        "than 100 nodes it is the slowest node. links: distinct node addresses the origin "
        "sent body bytes to."
    )
    for r in results:
        killed = ""
        if "killed" in r:
            killed = (
                f" (node {r['killed']} killed)"
                if r["killed"] is not None
                else " (none killed: done first)"
            )
        x_sb = r.get("x_sb") or {}
        per_node = " ".join(
            f"{i}:{'-' if t is None else f'{t:.1f}'}" + (f"({x_sb[i]:.2f})" if i in x_sb else "")
            for i, t in sorted(r["times"].items())
        )
        lines.append(f"{r['scenario']}{killed}: node:seconds(x S/B) {per_node}")
        if r.get("origin_by_node"):
            pulled = " ".join(
                f"{i}:{b / 2**20:.0f}" for i, b in sorted(r["origin_by_node"].items())
            )
            lines.append(f"  from the origin, node:MiB {pulled}")
        cpu = r.get("cpu") or {}
        if cpu.get("user_mean") is not None:
            daemons = ""
            if cpu.get("daemon_cpu_s") is not None and cpu.get("daemons"):
                per = cpu["daemon_cpu_s"] / cpu["daemons"]
                daemons = (
                    f"; the {cpu['daemons']} daemons {cpu['daemon_cpu_s']:.1f} CPU s of "
                    f"{cpu['cpu_seconds']:.0f} ({per:.1f} each)"
                )
            lines.append(
                f"  CPU: user {cpu['user_mean']:.0f}%, system {cpu['system_mean']:.0f}%, "
                f"softirq {cpu['softirq_mean']:.0f}%, idle {cpu['idle_mean']:.0f}%{daemons}"
            )
        for failure in r.get("failures", []):
            lines.append(f"  NOT DONE {failure}")
    return "\n".join(lines)
