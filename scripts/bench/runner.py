"""A scenario's runs: every tool in a worker of its own, interleaved, checked as they come."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from .config import ENTRY, GB, WORKER_TIMEOUT, GiB
from .data import Dataset
from .pagecache import evict, total_size, warm
from .scenarios import CACHE_FILL, WHOLE_FILE_TOOLS, kind_of, scenario_tools
from .stats import ToolResult, cpu_per_gb
from .tools.cache import warm_up_folder


def run_worker(
    tool: str, target: Path, env: dict[str, str], url: str | None, cache_dir: Path | None = None
) -> dict[str, Any]:
    """One measurement in a fresh interpreter; raises RuntimeError with its output on failure."""
    command = [sys.executable, str(ENTRY), "--worker", tool, str(target)]
    if url is not None:
        command += ["--url", url]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
        raise RuntimeError(f"exit {done.returncode}: " + "\n    ".join(tail))
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_scenario(
    scenario: str,
    dataset: Dataset,
    tools: Sequence[str],
    repeat: int,
    env: dict[str, str],
    url: str | None = None,
    caches: CacheFolders | None = None,
) -> dict[str, ToolResult]:
    """Every tool ``repeat`` times, interleaved; ``url`` is where nginx serves the dataset.

    ``caches`` gives each model-cache run its cache folder.
    """
    cold = kind_of(scenario) == "cold"
    tools = scenario_tools(scenario, tools)
    results = {tool: ToolResult() for tool in tools}
    print(f"\n== {scenario}: {dataset.target}" + (f" as {url}" if url else ""))
    if caches is not None:
        caches.fill(dataset, env, url)
    for rep in range(repeat):
        for tool in rotated(tools, rep):
            # Warm runs (and nginx, which serves from the page cache) read the files
            # into the cache before every run, not once: a proactive reclaimer such
            # as DAMON's pageout drops pages nobody touched for a few seconds.
            if cold:
                evict(dataset.paths)
            else:
                warm(dataset.paths)
            label = f"  [{rep + 1}/{repeat}] {tool:<12}"
            try:
                with caches.folder(tool) if caches is not None else nullcontext() as cache_dir:
                    run = run_worker(tool, dataset.target, env, url, cache_dir)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                results[tool].errors.append(str(exc))
                print(f"{label} FAILED {exc}")
                continue
            run["round"] = rep  # the runs of one round ran back to back: see paired_ratio
            results[tool].runs.append(run)
            checks = check_bytes(tool, run, dataset) + check_cache(tool, run)
            print(f"{label} {describe(run)}{checks}")
    return results


class CacheFolders:
    """The cache folders of model-cache, in a temporary folder under ``parent``.

    ``fill`` fills the one the warm-cache runs read, once, with an untimed worker;
    ``folder(tool)`` is the cache folder of one run. ``close`` removes them all.
    """

    def __init__(self, parent: Path) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=".bench-cache-", dir=parent))
        self.warm = self.root / "warm"
        self.files: list[Path] = []  # the filled cache's files, to read into the page cache

    def fill(self, dataset: Dataset, env: dict[str, str], url: str | None) -> None:
        label = f"  [untimed] {CACHE_FILL:<12}"
        try:
            run = run_worker(CACHE_FILL, dataset.target, env, url, self.warm)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"filling the cache {self.warm}: {exc}") from exc
        print(f"{label} {describe(run)}  into {self.warm}")
        self.files = sorted(p for p in self.warm.rglob("*") if p.is_file() and not p.is_symlink())

    @contextmanager
    def folder(self, tool: str) -> Iterator[Path | None]:
        """None for cold-remote, the filled cache for warm-cache, a fresh one for populate."""
        if tool == "warm-cache":
            warm(self.files)  # as a daemon that just fetched it leaves it
            yield self.warm
        elif tool == "populate":
            fresh = Path(tempfile.mkdtemp(prefix="populate-", dir=self.root))
            try:
                yield fresh
            finally:
                shutil.rmtree(fresh, ignore_errors=True)
                shutil.rmtree(warm_up_folder(fresh), ignore_errors=True)  # --reuse-memory's
                # On a file system mounted with ``discard`` the 3 GiB just freed are
                # trimmed at the journal's next commit: now, not inside the next run.
                os.sync()
        else:
            yield None

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def rotated(items: Sequence[str], by: int) -> list[str]:
    """``items`` starting at ``by`` (mod len): no tool always runs first, or after the same one."""
    by %= len(items) or 1
    return [*items[by:], *items[:by]]


def describe(run: dict[str, Any]) -> str:
    speed = run["bytes"] / run["seconds"] / GB
    rss = "" if run["peak_rss"] is None else f"  peak RSS {run['peak_rss'] / GiB:5.2f} GiB"
    if run["peak_rss"] is not None and not run["peak_rss_reset"]:
        rss += " (could not reset: includes the prefault buffer)"
    cache = run.get("cache")
    if cache is not None:
        rss += (
            f"  cache {cache['hits']} hit(s) {cache['misses']} miss(es)"
            f" {cache['downloaded'] / GB:.2f} GB downloaded"
        )
    fresh = run.get("fresh_memory_rate")
    if fresh:  # the prefault's fill rate: see worker.prefault
        rss += f"  fresh memory {fresh / GB:5.2f} GB/s"
    if run.get("reused_memory"):  # see worker.warm_up
        rss += f"  reused memory ({run['minor_faults']} page faults)"
    return f"{speed:6.2f} GB/s  {run['seconds']:6.2f} s  CPU {cpu_per_gb(run):5.2f} s/GB{rss}"


def check_bytes(tool: str, run: dict[str, Any], dataset: Dataset) -> str:
    """A warning when a tool delivered other than the bytes it should have."""
    if tool == "fio":  # reads whole 1 MiB blocks only; its own business
        return ""
    whole = tool in WHOLE_FILE_TOOLS
    expected = total_size(dataset.paths) if whole else dataset.tensor_bytes
    if run["bytes"] == expected:
        return ""
    return f"  WARNING: {run['bytes']} bytes, expected {expected}"


def check_cache(tool: str, run: dict[str, Any]) -> str:
    """A warning when warm-cache downloaded tensors, or populate found them cached."""
    cache = run.get("cache")
    if cache is None:
        return ""
    if tool == "warm-cache" and (cache["misses"] or cache["downloaded"]):
        return "  WARNING: the cache missed"
    if tool == "populate" and cache["hits"]:
        return "  WARNING: the fresh cache hit"
    return ""
