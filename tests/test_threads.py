"""The thread policy (aioloader/runtime/threads.py): every thread is a lane's, none the default
executor's, and an owner's lanes are gone once it is closed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from aioloader import Loader, ModelCache
from aioloader.devices.staged import HostCopyEngine
from aioloader.runtime.threads import PER_PROCESS, Lane, Lanes, lane_of, run_blocking

from .helpers import assert_matches_files, write_file, write_sharded
from .servers import FaultyHttpServer

MiB = 1 << 20

# Loads through HTTP with a cache (host memory, then staged), a warm load, a local
# load, then a fetch, a verify and a removal without a Loader; every thread started
# is recorded by name.
CHILD = """
import asyncio, json, sys, threading

started = []
_start = threading.Thread.start


def start(self):
    started.append(self.name)
    _start(self)


threading.Thread.start = start
default_callers = []  # who sent work to the default executor: the first frame outside asyncio
_run_in_executor = asyncio.BaseEventLoop.run_in_executor


def run_in_executor(self, executor, fn, *args):
    if executor is None:
        frame = sys._getframe(1)
        while frame is not None and "/asyncio/" in frame.f_code.co_filename:
            frame = frame.f_back
        default_callers.append(frame.f_code.co_filename if frame else "?")
    return _run_in_executor(self, executor, fn, *args)


asyncio.BaseEventLoop.run_in_executor = run_in_executor

from aioloader import Loader, ModelCache
from aioloader.devices.staged import HostCopyEngine

url, local, root = sys.argv[1:4]


async def main():
    async with Loader(cache_dir=root, chunk_size="256KiB") as loader:
        await loader.load(url)
    await ModelCache(root).wait_committed()
    async with Loader(cache_dir=root, chunk_size="256KiB") as loader:
        await loader.load(url)
        await loader.load(local)
    async with Loader(device=HostCopyEngine(), cache_dir=root + "-staged") as loader:
        await loader.load(url)
    cache = ModelCache(root + "-fetched")
    await cache.fetch(url)
    await cache.verify()
    await cache.remove(url)
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    return left


left = asyncio.run(main())
print(json.dumps({"started": started, "left": left, "default_callers": default_callers}))
"""


def test_a_load_through_http_and_the_cache_uses_no_default_executor(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    index = write_sharded(
        http_server.root / "m", {f"t{i}": torch.randn(256 * 1024) for i in range(6)}, shards=2
    )
    local = write_file(tmp_path / "local.safetensors", {"w": torch.randn(1024)})
    url = http_server.url_for(f"m/{index.name}")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(local), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    threads = json.loads(done.stdout.splitlines()[-1])
    started, left = threads["started"], threads["left"]
    assert started, "no thread started: the child loaded nothing?"
    # aioloader sends nothing to the default executor. aiohttp itself still does, for
    # its trust_env lookups (.netrc and the proxy variables, once per request): the
    # only default-executor threads (asyncio_N, and asyncio.run's shutdown of them).
    callers = threads["default_callers"]
    assert [c for c in callers if not c.endswith("aiohttp/client.py")] == [], callers
    others = [n for n in started if lane_of(n) is None]
    assert all(n.startswith("asyncio_") or "_do_shutdown" in n for n in others), others
    assert not any(n.startswith("ThreadPoolExecutor-") for n in started), started
    lanes = {lane_of(n) for n in started}
    assert {"warm", "cache", "compute"} <= lanes, lanes
    # What a Loader or a ModelCache call started is closed; only the process-wide
    # lanes that finish a load's cache writes may still run.
    assert [n for n in left if lane_of(n) is not None and lane_of(n) not in PER_PROCESS] == [], left


def _lanes_running() -> set[str]:
    running = {lane_of(t.name) for t in threading.enumerate()}
    return {lane for lane in running if lane is not None and lane not in PER_PROCESS}


async def test_every_lane_of_a_loader_is_gone_after_aclose(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    tensors = {f"t{i}": torch.randn(128 * 1024) for i in range(4)}
    remote = write_file(http_server.root / "m.safetensors", tensors)
    local = write_file(tmp_path / "local.safetensors", tensors)
    seen: set[str] = set()
    for device in ("cpu", HostCopyEngine()):
        async with Loader(
            device=device, cache_dir=tmp_path / "cache", chunk_size="128KiB"
        ) as loader:
            got = await loader.load(http_server.url_for("m.safetensors"))
            assert_matches_files(got, remote)
            got = await loader.load(str(local))
            assert_matches_files(got, local)
            seen |= _lanes_running()
        assert _lanes_running() == set(), "threads left after aclose"
    assert {"warm", "cache", "copy"} <= seen, seen
    await ModelCache(tmp_path / "cache").wait_committed()


async def test_a_closed_lane_refuses_work_and_run_blocking_waits_on_cancel() -> None:
    lanes = Lanes(2)
    assert await run_blocking(lanes.cache, lambda: 1 + 1) == 2
    assert lane_of(await run_blocking(lanes.cache, lambda: threading.current_thread().name)) == (
        "cache"
    )
    lanes.close()
    with pytest.raises(RuntimeError, match="closed"):
        lanes.cache.submit(print)
    with Lane("x", 1) as lane:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await run_blocking(lane, lambda: None)
