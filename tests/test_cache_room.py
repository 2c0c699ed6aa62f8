"""The cache's size cap holds for every entry, and a full or read-only cache never fails
a load: it warns once and streams from the remote, leaving nothing behind.

A real full disk is a small tmpfs, mounted where the tests run as root (as CI does);
elsewhere those tests skip, and a file size limit (RLIMIT_FSIZE) stands in.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from aioloader import ModelCache, load_model
from aioloader.cache.entry import key_of
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_matches_files, random_tensors, write_file
from .servers import FaultyHttpServer

PROBE = f"bytes=0-{PROBE_SIZE - 1}"


def model(seed: int, mib: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = random_tensors(seed=seed, count=4)
    out["big"] = torch.randn(mib * 256 * 1024, generator=gen)
    return out


def leftovers(root: Path) -> list[str]:
    """Files of entries that hold bytes: what a cache that gave up must not leave."""
    entries = root / "entries"
    if not entries.exists():
        return []
    return sorted(
        str(p.relative_to(root))
        for p in entries.rglob("*")
        if p.name not in ("lock", "use", "writer") and not p.is_dir()
    )


def data_gets(server: FaultyHttpServer) -> list[str | None]:
    return [r.range for r in server.gets() if r.range != PROBE]


# -- the cap -----------------------------------------------------------------------------


async def test_loads_hold_the_cap_the_cache_was_given(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    url = {}
    for i, name in enumerate("abcd"):
        write_file(http_server.root / f"{name}.safetensors", model(i))
        url[name] = http_server.url_for(f"{name}.safetensors")
    root = tmp_path / "cache"
    daemon = ModelCache(root, max_bytes=int(2.5 * (1 << 20)))
    await daemon.fetch(url["a"])
    # Pods load through the same folder without being told the cap: it is the cache's.
    for name in "bcd":
        await load_model(url[name], cache_dir=root)
        await daemon.wait_committed()  # the load commits (and evicts) after it returns
        on_disk = sum(e.bytes_on_disk for e in ModelCache(root).entries())
        assert on_disk <= daemon.max_bytes, f"{on_disk} bytes after loading {name}"  # type: ignore[operator]
    assert [e.url for e in ModelCache(root).entries()] == [url["c"], url["d"]]


async def test_abandoned_partial_entries_are_evicted_oldest_first(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    url = {}
    for i, name in enumerate("xab"):
        write_file(http_server.root / f"{name}.safetensors", model(i))
        url[name] = http_server.url_for(f"{name}.safetensors")
    root = tmp_path / "cache"
    cache = ModelCache(root, max_bytes=int(2.5 * (1 << 20)))
    # A pod loaded one tensor of x and went away: x is a partial entry, preallocated.
    await load_model(url["x"], cache_dir=root, tensors=["layer.0.weight"])
    await cache.wait_committed()  # its writes run after the load, holding the entry
    assert [e.complete for e in cache.entries()] == [False]
    await cache.fetch(url["a"])
    await cache.fetch(url["b"])
    assert [(e.url, e.complete) for e in cache.entries()] == [(url["a"], True), (url["b"], True)]
    assert cache.statistics().evictions == 1


# -- a full or read-only cache -----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a disk that really fills up (ENOSPC)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` up to ``leave`` free bytes."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    with (disk / "filler").open("wb") as fh:
        fh.write(b"\0" * (free - leave))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_full_disk_loads_from_the_remote_and_leaves_nothing(
    http_server: FaultyHttpServer,
    small_disk: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = write_file(http_server.root / "m.safetensors", model(0))
    url = http_server.url_for("m.safetensors")
    root = small_disk / "cache"
    fill(small_disk, 64 * 1024)  # room for the entry's folders, not for its bytes
    caplog.set_level(logging.WARNING, logger="aioloader")
    for _ in range(2):
        assert_matches_files(await load_model(url, cache_dir=root), path)
        assert leftovers(root) == []
    [warning] = warnings_of(caplog)  # once, not once per load
    assert str(root) in warning and "without caching" in warning and "free space" in warning


async def test_a_disk_that_fills_up_mid_load_leaves_nothing(
    http_server: FaultyHttpServer,
    small_disk: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = write_file(http_server.root / "m.safetensors", model(0))
    url = http_server.url_for("m.safetensors")
    root = small_disk / "cache"
    pages = -(-path.stat().st_size // 4096)
    # Room for the preallocated bytes and meta.json, and not one page more: the first
    # line of the range journal finds the disk full, in the middle of the load.
    fill(small_disk, (pages + 1) * 4096)
    caplog.set_level(logging.WARNING, logger="aioloader")
    assert_matches_files(await load_model(url, cache_dir=root, chunk_size="64KiB"), path)
    # Host loads write the cache after they return (write_after.py): the giving up comes then.
    await ModelCache(root).wait_committed()
    assert leftovers(root) == []
    assert len(warnings_of(caplog)) == 1


async def test_a_read_only_cache_serves_what_it_holds(
    http_server: FaultyHttpServer,
    small_disk: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    paths, url = {}, {}
    for i, name in enumerate("ab"):
        paths[name] = write_file(http_server.root / f"{name}.safetensors", model(i))
        url[name] = http_server.url_for(f"{name}.safetensors")
    root = small_disk / "cache"
    await ModelCache(root).fetch(url["a"])
    remount = ["mount", "-o", "remount,ro", str(small_disk)]
    await asyncio.to_thread(subprocess.run, remount, check=True)
    caplog.set_level(logging.WARNING, logger="aioloader")
    http_server.reset_counters()
    assert_matches_files(await load_model(url["a"], cache_dir=root), paths["a"])
    assert data_gets(http_server) == []  # a hit
    assert_matches_files(await load_model(url["b"], cache_dir=root), paths["b"])
    assert not (root / "entries" / key_of(url["b"])).exists()
    [warning] = warnings_of(caplog)
    assert str(root) in warning and "without caching" in warning


async def test_a_file_size_limit_loads_without_caching(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    # Runs anywhere: writes past RLIMIT_FSIZE fail with EFBIG, like a full quota.
    write_file(http_server.root / "m.safetensors", model(0))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    code = (
        "import asyncio, resource, sys; from aioloader import load_model\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))\n"
        "got = asyncio.run(load_model(sys.argv[2], cache_dir=sys.argv[1]))\n"
        "print(sum(t.numel() for t in got.values()))\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(root), url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert int(out) == sum(t.numel() for t in model(0).values())
    assert "without caching" in err.decode()
    assert leftovers(root) == []


def test_an_error_without_words_is_named_by_its_kind() -> None:
    """A timeout met while a file lands (an OSError with no message) named nothing:
    'writing URL failed ()' (fleet_bench's cold run). It says what it was now."""
    from aioloader.cache.entry import cache_error

    said = str(cache_error(TimeoutError(), Path("/c"), "writing http://x/a.safetensors"))
    assert "failed (TimeoutError)" in said and "()" not in said
    assert "failed (disk full)" in str(cache_error(OSError("disk full"), Path("/c"), "writing"))
