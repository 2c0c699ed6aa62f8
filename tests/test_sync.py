"""load_model_sync: the blocking API, from scripts, threads, loops and Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import aioloader
from aioloader import ConfigError, EventLoopError

from .helpers import assert_same, random_tensors, write_file


def test_plain_script(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=4))
    code = textwrap.dedent(
        f"""
        import aioloader
        tensors = aioloader.load_model_sync({str(path)!r}, concurrency=2)
        print(sorted(tensors))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(sorted(random_tensors(count=4)))


async def test_refused_on_the_running_loop(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited"
        with pytest.raises(EventLoopError, match=r"await aioloader\.load_model") as caught:
            aioloader.load_model_sync(str(path))
    assert isinstance(caught.value, RuntimeError)


async def test_from_a_thread_while_the_loop_runs(tmp_path: Path) -> None:
    tensors = random_tensors(count=5)
    path = write_file(tmp_path / "m.safetensors", tensors)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        got = await asyncio.to_thread(aioloader.load_model_sync, str(path))
    finally:
        ticker.cancel()
    assert_same(got, tensors)


def test_four_threads_at_once(tmp_path: Path) -> None:
    models = [random_tensors(seed=i, count=6, big=3) for i in range(4)]
    paths = [write_file(tmp_path / f"m{i}.safetensors", m) for i, m in enumerate(models)]
    start = threading.Barrier(4)

    def load(path: Path) -> dict[str, object]:
        start.wait()
        return aioloader.load_model_sync(str(path), concurrency=3, chunk_size="1MiB")

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(load, paths))
    for got, want in zip(results, models, strict=True):
        assert_same(got, want)


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": "many"}, "concurrency"),
        ({"memory_limit": "lots"}, "memory_limit"),
        ({"concurency": 4}, "concurrency"),  # a typo names the keyword it meant
        ({"device": "tpu"}, "tpu"),
    ],
)
def test_bad_options(tmp_path: Path, keywords: dict[str, object], match: str) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=1))
    with pytest.raises(ConfigError, match=match):
        aioloader.load_model_sync(str(path), **keywords)  # type: ignore[arg-type]


def test_bad_url(tmp_path: Path) -> None:
    with pytest.raises(aioloader.NotFoundError):
        aioloader.load_model_sync(str(tmp_path / "missing.safetensors"))
    with pytest.raises(ConfigError):
        aioloader.load_model_sync([])


_STALLED_CHILD = """
import socket, sys, threading, time
import aioloader

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
held = []

def accept():
    while True:
        conn, _ = listener.accept()
        held.append(conn)  # never answers: the load waits on it

threading.Thread(target=accept, daemon=True).start()
url = f"http://127.0.0.1:{listener.getsockname()[1]}/m.safetensors"
print("loading", flush=True)
try:
    aioloader.load_model_sync(url, stall_timeout=600, connect_timeout=600)
except KeyboardInterrupt:
    left = [t.name for t in threading.enumerate() if t.name.startswith("aioloader-")]
    print("interrupted, threads left:", left, flush=True)
    sys.exit(130)
print("finished?", flush=True)
"""


def test_ctrl_c_interrupts_the_load() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _STALLED_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "loading"
        # Wait until its request has reached the silent server, then press Ctrl-C.
        time.sleep(1.5)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert "interrupted, threads left: []" in out, (out, err)
