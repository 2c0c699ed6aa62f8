"""One timed load in a fresh process (``--worker TOOL PATH``), printed as JSON."""

from __future__ import annotations

import gc
import os
import resource
import time
from pathlib import Path
from typing import Any

from .config import LANES, REUSE_MEMORY, KiB
from .scenarios import CACHE_FILL
from .tools.base import Prepared
from .tools.cache import CACHE_PREPARE, wait_committed, warm_up_folder
from .tools.local import PREPARE
from .tools.remote import PARALLEL_PREPARE, REMOTE_PREPARE, remote_job


def safetensors_files(target: Path) -> list[Path]:
    return sorted(target.glob("*.safetensors")) if target.is_dir() else [target]


def proc_status(field_name: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * KiB
    raise KeyError(field_name)


def reset_peak_rss() -> bool:
    """Set VmHWM back to the current RSS (Linux 4.0+); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def prefault(nbytes: int) -> float:
    """Touch, then free, ``nbytes`` of fresh memory (see the package docstring); returns
    how fast it filled, in bytes per second: how much memory the host had to hand
    back just then, which sets the pace of every load into fresh memory."""
    import numpy as np

    start = time.perf_counter()
    buffer = np.ones(nbytes, np.uint8)
    seconds = time.perf_counter() - start
    del buffer
    return nbytes / seconds if seconds > 0 else 0.0


def minor_faults() -> int:
    """Minor page faults of this process so far: a load into fresh memory takes one per
    page (or huge page) it fills; one into memory the process had touched, almost none."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process, all its threads, and its waited-for children."""
    user = system = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        user, system = user + usage.ru_utime, system + usage.ru_stime
    return user, system


def prepare(
    tool: str, target: Path, files: list[Path], url: str | None, cache_dir: Path | None = None
) -> Prepared:
    """The tool's load of ``target``: from disk, or from ``url`` where nginx serves it.

    The model-cache tools read through the cache in ``cache_dir`` (none: no cache); in
    the parallel scenarios (``$BENCH_LANES`` set) the tools receive on that many cores.
    """
    if url is None:
        return PREPARE[tool](target, files)
    job = remote_job(target, files, url)
    if tool in CACHE_PREPARE:
        return CACHE_PREPARE[tool](job, cache_dir)
    lanes = os.environ.get(LANES)
    if lanes is not None:
        return PARALLEL_PREPARE[tool](job, int(lanes))
    return REMOTE_PREPARE[tool](job)


def warm_up(
    tool: str, target: Path, files: list[Path], url: str | None, cache_dir: Path | None
) -> None:
    """``--reuse-memory``: one untimed load by the same tool, then freed, so that the
    timed one fills memory this process has touched (the retaining jemalloc hands
    it out again). populate's warm-up writes a cache folder of its own (the timed
    run's must start empty), committed before the clock starts. It is deleted
    after the timed run (runner.CacheFolders): deleting 3 GiB just before it would
    put the file system's trim of them inside it."""
    if tool == "populate" and cache_dir is not None:
        folder = warm_up_folder(cache_dir)
        prepare(tool, target, files, url, folder)()
        wait_committed(folder)
    else:  # prepared anew all the same: the timed load's cache counters count it alone
        prepare(tool, target, files, url, cache_dir)()


def worker(
    tool: str, target: Path, url: str | None = None, cache_dir: Path | None = None
) -> dict[str, Any]:
    """One timed load; every tool imports torch first, so all start from the same process."""
    import torch  # noqa: F401  (seconds to import, and not load time)

    files = safetensors_files(target)
    prepared = time.perf_counter()
    load = prepare(tool, target, files, url, cache_dir)  # the tool's imports, once per process
    prepared = time.perf_counter() - prepared
    reuse = os.environ.get(REUSE_MEMORY) == "1" and tool != CACHE_FILL  # the fill is untimed
    if reuse:
        warm_up(tool, target, files, url, cache_dir)
    # Importing torch leaves a full collection of its ~10^6 objects pending: the
    # first Python code after it that allocates a few hundred objects pays it
    # (70-80 ms measured here, inside aioloader's first load; plain preadv
    # allocates too little to trigger it). Every tool starts after that collection.
    gc.collect()
    # Last before the clock: freed memory stays backed by the host only briefly
    # (see prefault), so nothing that takes time may come between.
    fresh_memory = None if reuse else prefault(sum(p.stat().st_size for p in files))
    rss_reset = reset_peak_rss()
    rss_before = proc_status("VmRSS")
    user, system = cpu_seconds()
    faults = minor_faults()
    start = time.perf_counter()
    loaded = load()
    seconds = time.perf_counter() - start
    faults = minor_faults() - faults
    user_after, system_after = cpu_seconds()
    return {
        "tool": tool,
        "bytes": loaded.nbytes,
        "seconds": loaded.seconds if loaded.seconds is not None else seconds,
        "wall_seconds": seconds,
        "prepare_seconds": prepared,
        "fresh_memory_rate": fresh_memory,
        "minor_faults": faults,
        "reused_memory": reuse,
        "first_tensor_seconds": None if loaded.first is None else loaded.first - start,
        "cpu_user": user_after - user,
        "cpu_system": system_after - system,
        "rss_before": rss_before,
        "peak_rss": proc_status("VmHWM") if loaded.in_process else None,
        "peak_rss_reset": rss_reset,
        "cache": loaded.cache,
    }
