"""The machine the benchmark runs on, and the programs it installs there."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from .config import REUSE_MEMORY, RUNAI_DEFAULT_LIMIT, GiB, KiB


def read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def meminfo(key: str) -> int:
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * KiB
    return 0


def cpu_model() -> str | None:
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def filesystem_of(path: Path) -> str | None:
    """``device (fstype)`` of the mount holding ``path``."""
    path = path.resolve()
    best: tuple[int, str] | None = None
    for line in (read_text("/proc/mounts") or "").splitlines():
        device, mount, fstype = line.split()[:3]
        if path.is_relative_to(mount) and (best is None or len(mount) > best[0]):
            best = (len(mount), f"{device} ({fstype}) on {mount}")
    return best[1] if best else None


def version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def fio_version() -> str | None:
    fio = shutil.which("fio")
    if fio is None:
        return None
    return subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()


def program_version(program: str | None, *args: str) -> str | None:
    """The first line ``program args`` prints (nginx prints its version on stderr)."""
    if program is None:
        return None
    done = subprocess.run([program, *args], capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0] if lines else None


def machine_info(out: Path) -> dict[str, Any]:
    packages = ("aioloader", "torch", "numpy", "safetensors", "runai-model-streamer", "uvloop")
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "memory_gib": round(meminfo("MemTotal") / GiB, 2),
        "kernel": platform.release(),
        "thp_enabled": read_text("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_defrag": read_text("/sys/kernel/mm/transparent_hugepage/defrag"),
        "proactive_reclaim": proactive_reclaim(),
        "free_page_reporting": free_page_reporting(),
        "filesystem": filesystem_of(out if out.exists() else out.parent),
        "python": platform.python_version(),
        "versions": {name: version_of(name) for name in packages},
        "fio": fio_version(),
    }


def proactive_reclaim() -> str | None:
    """DAMON schemes running on this machine whose action reclaims memory, e.g. "pageout"."""
    found = []
    for scheme in sorted(
        Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/contexts/*/schemes/*")
    ):
        kdamond = scheme.parents[3]
        action = read_text(str(scheme / "action"))
        if read_text(str(kdamond / "state")) == "on" and action in ("pageout", "lru_deprio"):
            found.append(f"DAMON {action}")
    return ", ".join(sorted(set(found))) or None


def free_page_reporting() -> str | None:
    """How this VM hands freed memory back to its host, when it does (virtio-balloon).

    Memory handed back is slow to touch again (the host must supply it), so a
    load into fresh memory runs at the pace the host sets: see worker.prefault.
    """
    parameters = Path("/sys/module/page_reporting/parameters")
    if not Path("/sys/bus/virtio/drivers/virtio_balloon").exists() or not parameters.is_dir():
        return None
    wait = read_text(str(parameters / "min_free_ms"))
    order = read_text(str(parameters / "page_reporting_order"))
    return f"free memory is reported to the host after {wait} ms, in blocks of order {order}"


def print_machine(info: dict[str, Any]) -> None:
    print(f"machine: {info['cpus']} CPUs ({info['cpus_usable']} usable), {info['cpu_model']}")
    print(f"         {info['memory_gib']} GiB RAM, kernel {info['kernel']}")
    print(f"         THP enabled: {info['thp_enabled']}; defrag: {info['thp_defrag']}")
    print(f"         data on {info['filesystem']}")
    if info["proactive_reclaim"]:
        print(f"         proactive reclaim: {info['proactive_reclaim']} (warm runs re-read first)")
    if info["free_page_reporting"]:
        print(f"         {info['free_page_reporting']} (see 'fresh memory' per run)")
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    print(f"python {info['python']}: {versions}; fio: {info['fio']}")


def worker_env() -> dict[str, str]:
    """The workers' environment: runai's 40 GB default memory limit capped to half of RAM."""
    env = dict(os.environ)
    if "RUNAI_STREAMER_MEMORY_LIMIT" not in env:
        limit = min(RUNAI_DEFAULT_LIMIT, meminfo("MemTotal") // 2)
        env["RUNAI_STREAMER_MEMORY_LIMIT"] = str(limit)
    print(
        f"runai: RUNAI_STREAMER_MEMORY_LIMIT={env['RUNAI_STREAMER_MEMORY_LIMIT']}, "
        f"RUNAI_STREAMER_CONCURRENCY={env.get('RUNAI_STREAMER_CONCURRENCY', 'unset (default)')}"
    )
    return env


# jemalloc set to keep what is freed backed and mapped: memory a process frees
# is given to its next allocations as it is, never back to the system.
RETAINING_MALLOC = "retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"


def jemalloc_library() -> str | None:
    """The path of libjemalloc's shared library (Debian's libjemalloc2), if installed."""
    done = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libjemalloc.so.2"):
            return path.strip()
    return None


def reuse_memory_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with every worker's allocations made by a retaining jemalloc (see
    ``--reuse-memory``); installs it with apt-get when missing."""
    if not apt_install("libjemalloc2", jemalloc_library):
        raise SystemExit("--reuse-memory needs libjemalloc2, which apt-get could not install")
    library = jemalloc_library()
    assert library is not None
    print(f"reuse memory: workers run with LD_PRELOAD={library} MALLOC_CONF={RETAINING_MALLOC}")
    return dict(env, LD_PRELOAD=library, MALLOC_CONF=RETAINING_MALLOC, **{REUSE_MEMORY: "1"})


def ensure_fio() -> bool:
    """Install fio with apt-get when it is missing; True when it is there after."""
    if apt_install("fio", lambda: shutil.which("fio")):
        return True
    print("  WARNING: could not install fio; cold scenarios have no ceiling")
    return False


def apt_install(package: str, found: Callable[[], str | None]) -> bool:
    """apt-get install ``package`` unless ``found()`` finds it already; True if it does after."""
    if found():
        return True
    print(f"{package} not found: installing it with apt-get")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*sudo, "apt-get", "install", "-y", "-q", package]
    for command in (install, [*sudo, "apt-get", "update", "-q"], install):
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode == 0 and found():
            return True
    return False
