"""How much memory this process may use: the container's limit, else the machine's RAM.

Kubernetes enforces a pod's ``resources.limits.memory`` through the cgroup it puts
the container in; going over it gets the process OOM-killed with no Python error.
So the default staging budget is derived from that limit, never from a constant
(``config.staging_budget``; ``Limits`` reads the limit here when it is made).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryLimit", "detect_memory_limit", "memory_limit"]

# cgroup v1 reports "no limit" as a huge number close to 2**63.
_V1_UNLIMITED = 1 << 60
# How long ``memory_limit`` keeps what it read. Reading the cgroup's files took 2-3 ms
# here (a dozen opens of /proc and /sys), four times a load, on the event loop: most of
# a small warm load's fixed cost (docs/benchmarks.md). A pod's limit changes only when
# it is resized in place; five seconds late is harmless.
FRESH_FOR = 5.0
_last: tuple[float, MemoryLimit] | None = None


@dataclass(frozen=True)
class MemoryLimit:
    """A memory ceiling and where it was read from."""

    bytes: int
    source: str


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value < _V1_UNLIMITED else None


def _cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """Return this process's cgroup v2 path and v1 memory-controller path."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _walk_up(root: Path, rel: str, filename: str) -> list[tuple[int, Path]]:
    """Limits set on the cgroup and on each of its ancestors (the smallest wins)."""
    found = []
    current = Path(rel.lstrip("/")) if rel else Path()
    while True:
        candidate = root / current / filename
        value = _read_int(candidate)
        if value is not None:
            found.append((value, candidate))
        if current == Path() or str(current) == ".":
            break
        current = current.parent
    return found


def detect_memory_limit(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> MemoryLimit:
    """Find the memory ceiling that applies to this process.

    Order: cgroup v2 ``memory.max`` (this cgroup and its ancestors), cgroup v1
    ``memory.limit_in_bytes``, then physical RAM. The smallest limit found wins.

    Returns:
        The limit in bytes and a human-readable description of where it came from.
    """
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    candidates: list[tuple[int, str]] = [(physical, "physical RAM")]
    try:
        text = proc_cgroup.read_text()
    except OSError:
        text = ""
    v2, v1 = _cgroup_paths(text)
    if v2 is not None:
        for value, path in _walk_up(cgroup_root, v2, "memory.max"):
            candidates.append((value, f"cgroup v2 {path}"))
    if v1 is not None:
        for value, path in _walk_up(cgroup_root / "memory", v1, "memory.limit_in_bytes"):
            candidates.append((value, f"cgroup v1 {path}"))
    # A container sees its own cgroup as the root of the mount.
    for path in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        limit = _read_int(path)
        if limit is not None:
            candidates.append((limit, f"cgroup {path}"))
    value, source = min(candidates, key=lambda c: c[0])
    return MemoryLimit(bytes=value, source=source)


def memory_limit() -> MemoryLimit:
    """``detect_memory_limit()``, read again at most every ``FRESH_FOR`` seconds."""
    global _last
    now, last = time.monotonic(), _last
    if last is not None and 0 <= now - last[0] < FRESH_FOR:
        return last[1]
    found = detect_memory_limit()
    _last = (now, found)
    return found
