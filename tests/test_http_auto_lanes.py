"""``receive_lanes="auto"``: range bodies received on the caller's loop until its thread is
busy, then on receive lanes, against real local servers.

The loop is made busy for real: a task on it computes in 20 ms slices, as a server's own
work would. Which thread received each body is observed with test_http_lanes.py's
profile hook, and every load is compared bit for bit with the safetensors library.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from aioloader import ConfigError, HttpOptions, ObjectChangedError, load_model
from aioloader.runtime.threads import usable_cpus
from aioloader.settings.options import LoadOptions
from aioloader.sources.http.auto_lanes import busy_share, demand_clock
from aioloader.sources.stores import Stores, locate

from .helpers import assert_matches_files
from .servers import FaultyHttpServer
from .test_http import NAME, pass_probe, poll, write_big
from .test_http_lanes import receipts, receive_threads

LANES = {"aioloader-receive_0", "aioloader-receive_1"}

needs_two_cpus = pytest.mark.skipif(
    usable_cpus() < 2, reason="auto starts lanes only where the process may use two CPUs"
)


@asynccontextmanager
async def busy_loop() -> AsyncIterator[None]:
    """A task that keeps the running loop's thread computing, 20 ms at a time."""
    stop = asyncio.Event()

    async def compute() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            while time.perf_counter() - started < 0.02:
                pass
            await asyncio.sleep(0)

    task = asyncio.create_task(compute())
    try:
        yield
    finally:
        stop.set()
        await task


def lane_bytes(seen: dict[str, int]) -> int:
    return sum(n for name, n in seen.items() if name.startswith("aioloader-receive_"))


# -- when the lanes start -----------------------------------------------------------------


@needs_two_cpus
async def test_a_busy_loop_moves_receiving_to_the_lanes(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=256)  # 64 MiB
    with receipts() as seen:
        async with busy_loop():
            got = await load_model(
                http_server.url_for(NAME), chunk_size="1MiB", receive_lanes="auto"
            )
    assert_matches_files(got, path)
    main = threading.current_thread().name
    assert all(n == main or n.startswith("aioloader-receive_") for n in seen.bytes), seen.bytes
    assert lane_bytes(seen.bytes) > 0, seen.bytes
    assert receive_threads() == [], "lanes left running after the load"


async def test_an_idle_loop_receives_on_its_own_thread(http_server: FaultyHttpServer) -> None:
    """A slow server leaves the loop waiting: no lane starts, whatever the CPUs."""
    path = write_big(http_server.root, count=12)  # 3 MiB
    pass_probe(http_server)
    http_server.stall(NAME, 0.3, after_bytes=100_000, count=100)  # each GET pauses once
    with receipts() as seen:
        got = await load_model(
            http_server.url_for(NAME), chunk_size="256KiB", concurrency=2, receive_lanes="auto"
        )
    assert_matches_files(got, path)
    assert lane_bytes(seen.bytes) == 0, seen.bytes
    assert receive_threads() == []


def test_a_computing_thread_is_busy_and_a_sleeping_one_is_not() -> None:
    """The measure auto reads on the loop's thread, on this machine's own clock: the wait
    for a core (two busy loops beside the test) is taken out of both."""
    clock = demand_clock()

    def share(work: Callable[[], None]) -> float:
        (ran, waited), started = clock(), time.perf_counter()
        work()
        ran_after, waited_after = clock()
        return busy_share(time.perf_counter() - started, ran_after - ran, waited_after - waited)

    def compute() -> None:
        started = time.perf_counter()
        while time.perf_counter() - started < 0.3:
            pass

    assert share(compute) >= 0.9
    assert share(lambda: time.sleep(0.3)) < 0.2


@pytest.mark.parametrize(
    "wall, ran, waited, share",
    [(1.0, 0.5, 0.5, 1.0), (1.0, 0.1, 0.0, 0.1), (1.0, 0.1, 0.8, 0.5), (1.0, 0.0, 1.0, 1.0),
     (1.0, 0.0, 0.0, 0.0), (1.0, 0.9, 0.2, 1.0), (0.5, 0.25, 0.0, 0.5)],
)  # fmt: skip
def test_the_busy_share_leaves_out_the_wait_for_a_core(
    wall: float, ran: float, waited: float, share: float
) -> None:
    assert busy_share(wall, ran, waited) == pytest.approx(share)


# -- bad values ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["AUTO", " auto", "auto ", "", "lanes", b"auto", "2"])
def test_only_the_word_auto_is_taken(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^receive_lanes must be") as info:
        HttpOptions(receive_lanes=value)  # type: ignore[arg-type]
    assert "or 'auto'" in str(info.value)


def test_auto_is_taken_from_the_keyword_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert HttpOptions(receive_lanes="auto").receive_lanes == "auto"
    assert LoadOptions.build(receive_lanes="auto").http.receive_lanes == "auto"
    monkeypatch.setenv("AIOLOADER_RECEIVE_LANES", " auto ")
    assert LoadOptions.build().http.receive_lanes == "auto"
    monkeypatch.setenv("AIOLOADER_RECEIVE_LANES", "sometimes")
    with pytest.raises(ConfigError, match="AIOLOADER_RECEIVE_LANES"):
        LoadOptions.build()


# -- lying servers, cancellation, close ----------------------------------------------------


@needs_two_cpus
@pytest.mark.parametrize("inject", ["reset", "short", "500"])
async def test_a_lying_server_after_the_switch_is_retried_as_before(
    http_server: FaultyHttpServer, inject: str
) -> None:
    path = write_big(http_server.root, count=128)  # 32 MiB
    pass_probe(http_server)
    if inject == "reset":
        http_server.reset_after(NAME, 10_000, count=6)
    elif inject == "short":
        http_server.short_body(NAME, count=6)
    else:
        http_server.status(NAME, 500, count=3)
    with receipts() as seen:
        async with busy_loop():
            got = await load_model(
                http_server.url_for(NAME), chunk_size="512KiB", receive_lanes="auto"
            )
    assert_matches_files(got, path)
    assert lane_bytes(seen.bytes) > 0, seen.bytes
    assert receive_threads() == []


@needs_two_cpus
async def test_a_file_that_changes_after_the_switch_fails_the_load(
    http_server: FaultyHttpServer,
) -> None:
    write_big(http_server.root, count=128)
    pass_probe(http_server)
    http_server.change_after(NAME, 40)
    async with busy_loop():
        with pytest.raises(ObjectChangedError, match="changed on the server"):
            await load_model(http_server.url_for(NAME), chunk_size="256KiB", receive_lanes="auto")
    assert receive_threads() == []


@needs_two_cpus
async def test_a_close_after_the_switch_ends_every_lane(http_server: FaultyHttpServer) -> None:
    (http_server.root / NAME).write_bytes(os.urandom(64 << 20))
    url = http_server.url_for(NAME)
    stores = Stores(LoadOptions.build(receive_lanes="auto", stall_timeout=30.0))
    reads: list[asyncio.Task[None]] = []
    try:
        blob = await stores.source(locate(url)).open(url)
        async with busy_loop():
            for i in range(64):
                buffer = memoryview(bytearray(1 << 20))
                reads.append(asyncio.create_task(blob.read_into(i << 20, [buffer])))
                await asyncio.sleep(0.02)
                if receive_threads():
                    break
            assert await poll(lambda: len(receive_threads()) == 2, seconds=10)
            http_server.stall(NAME, 20.0, after_bytes=1_000, count=4)
            for i in range(4):
                buffer = memoryview(bytearray(1 << 20))
                reads.append(asyncio.create_task(blob.read_into((i + 60) << 20, [buffer])))
            await asyncio.sleep(0.2)
    finally:
        started = time.monotonic()
        await stores.aclose()
    assert time.monotonic() - started < 5.0, "the close waited for the stalled transfers"
    assert receive_threads() == [], "lanes left running after the close"
    await asyncio.gather(*reads, return_exceptions=True)
    await blob.aclose()


_CHILD = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    if sys.argv[3] == "one":
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    from safetensors.torch import load_file
    import torch
    from aioloader import load_model
    from tests.test_http_lanes import receipts

    async def main():
        stop = asyncio.Event()
        async def compute():
            while not stop.is_set():
                started = time.perf_counter()
                while time.perf_counter() - started < 0.02:
                    pass
                await asyncio.sleep(0)
        hog = asyncio.create_task(compute())
        with receipts() as seen:
            got = await load_model(sys.argv[1], chunk_size="1MiB", receive_lanes="auto")
        stop.set()
        await hog
        return got, dict(seen.bytes)

    got, seen = asyncio.run(main())
    want = load_file(sys.argv[2])
    assert set(got) == set(want)
    for name, tensor in want.items():
        raw = tensor.reshape(-1).view(torch.uint8)
        assert got[name].reshape(-1).view(torch.uint8).equal(raw), name
    print(json.dumps(sorted(seen)))
    """
)


def _child(url: str, path: Path, cpus: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, str(path), cpus],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip


def _threads(child: subprocess.Popen[str]) -> set[str]:
    out, err = child.communicate(timeout=180)
    assert child.returncode == 0, err[-3000:]
    return set(json.loads(out.splitlines()[-1]))


@needs_two_cpus
def test_two_processes_at_once_each_start_their_own_lanes(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=256)
    children = [_child(http_server.url_for(NAME), path, "all") for _ in range(2)]
    for child in children:
        assert _threads(child) & LANES, "a busy loop's process received on its loop alone"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="sched_setaffinity: Linux")
def test_a_process_on_one_cpu_never_starts_lanes(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=256)
    seen = _threads(_child(http_server.url_for(NAME), path, "one"))
    assert not seen & LANES, seen
