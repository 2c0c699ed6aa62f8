"""The one sync bridge (aioloader/runtime/sync.py) and vLLM's calls through it, from a thread
whose event loop is running: vLLM's worker is synchronous and may own one."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from safetensors.torch import load_file

from aioloader import EventLoopError, ModelCache
from aioloader.runtime.sync import run, run_beside
from aioloader.vllm import VllmOptions, fill_cache, stream_weights

from .helpers import assert_same, random_tensors, write_file
from .http_server import FaultyHttpServer


async def _thread_name() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


async def test_run_refuses_a_running_loops_thread() -> None:
    made = []
    with pytest.raises(EventLoopError, match=r"^f\(\) was called on the thread .* do this"):
        run(lambda: made.append(1) or _thread_name(), caller="f()", instead="do this")
    assert made == []  # nothing made, so no coroutine left never awaited


def test_run_runs_on_this_thread_without_a_loop() -> None:
    assert run(_thread_name, caller="f()", instead="-") == threading.current_thread().name


async def test_run_beside_works_on_a_running_loops_thread() -> None:
    assert run_beside(_thread_name) == "aioloader-sync"


def test_run_beside_raises_the_coroutines_error() -> None:
    async def fail() -> None:
        raise ValueError("from the loop's thread")

    with pytest.raises(ValueError, match="from the loop's thread"):
        run_beside(fail)


async def test_vllm_fills_the_cache_from_a_running_loops_thread(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """``download_model``'s fill ran ``asyncio.run`` on vLLM's thread: with a loop
    running there it raised RuntimeError (asyncio.run() cannot be called from a
    running event loop) and left the coroutine never awaited."""
    path = write_file(http_server.root / "m.safetensors", random_tensors(count=4))
    url = http_server.url_for("m.safetensors")
    options = VllmOptions.parse({"cache_dir": str(tmp_path / "cache")})
    fill_cache(options, url)  # on this thread, whose loop runs this test
    cached = await ModelCache(tmp_path / "cache").fetch(url)
    assert cached.hit and cached.downloaded == 0
    assert_same(load_file(cached.files[url]), load_file(path))


async def test_vllm_streams_weights_on_a_running_loops_thread(tmp_path: Path) -> None:
    tensors = random_tensors(count=6)
    path = write_file(tmp_path / "m.safetensors", tensors)
    got = dict(stream_weights(str(path)))
    assert_same(got, tensors)


async def test_a_stream_closed_early_cancels_its_load(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=6))
    weights = stream_weights(str(path))
    next(weights)
    weights.close()  # cancels the load and joins its thread (the leak check sees none)
    assert not [t for t in threading.enumerate() if t.name == "aioloader-vllm"]
