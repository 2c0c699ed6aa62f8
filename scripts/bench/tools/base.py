"""What every tool returns, and the two loaders that are tools both locally and remotely."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Loaded:
    """What a tool produced: kept alive past the clock so freeing it is not timed."""

    keep: Any
    nbytes: int
    seconds: float | None = None  # set by tools that time themselves (fio)
    in_process: bool = True  # False where a child process does the work (fio): no peak RSS
    cache: dict[str, int] | None = None  # the cache's counters (model-cache), once loaded
    first: float | None = None  # perf_counter() when the first tensor was usable, if known


Prepared = Callable[[], Loaded]


def tensor_bytes(tensors: dict[str, Any]) -> int:
    return sum(t.nbytes for t in tensors.values())


def event_loop_runner() -> Callable[[Any], Any]:
    """``uvloop.run`` when uvloop is installed, else ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    run: Callable[[Any], Any] = uvloop.run
    return run


async def stream_all(
    target: str | list[str],
    cache_dir: Any = None,
    into: dict[str, Any] | None = None,
    http: Any = None,
) -> float | None:
    """``load_model(target)`` as a stream, which is the same load: the tensors go into
    ``into``; returns when the first one arrived (``perf_counter``). ``http``: an
    ``aioloader.HttpOptions`` (None: the defaults).

    The tensors are not the coroutine's result on purpose: on Python 3.11,
    ``asyncio.run`` formats ``repr`` of its main task (result included: four
    tensors' values) when it restores the SIGINT handler, 20-35 ms that would
    be counted as the load's.
    """
    import aioloader

    tensors = {} if into is None else into
    first = None
    loader = aioloader.Loader(cache_dir=cache_dir, http=http)
    async with loader, loader.stream(target) as stream:
        async for name, tensor in stream:
            if first is None:
                first = time.perf_counter()
            tensors[name] = tensor
    return first


def import_for_load(target: str | list[str]) -> None:
    """Import what a host load of ``target`` runs: the API, the pipeline, the host
    device, the Solo strategy and the backend of ``target``'s scheme."""
    import importlib

    import aioloader
    from aioloader.sources.auto import scheme_of
    from aioloader.sources.schemes import scheme_named

    aioloader.Loader  # noqa: B018 - the lazy attribute imports aioloader.api
    for module in ("load.pipeline", "devices.cpu", "ranks.strategy", "load.stream"):
        importlib.import_module(f"aioloader.{module}")
    first = target if isinstance(target, str) else target[0]
    row = scheme_named(scheme_of(first))
    if row is not None:
        importlib.import_module(f"aioloader.sources.{row.module}")


def aioloader_load(target: str | list[str], http: Any = None) -> Prepared:
    """``aioloader.load_model(target)``: a path or URL, or a list of files; ``http``
    an ``aioloader.HttpOptions`` for remote ones (None: the defaults).

    The package is imported here, before the clock, as every other tool's is:
    the worker times this preparation apart (``prepare_seconds``). ``import
    aioloader`` loads its public names when first used, so the modules a load of
    ``target`` runs are imported here too.
    """
    import_for_load(target)

    run = event_loop_runner()

    def load() -> Loaded:
        tensors: dict[str, Any] = {}
        first = run(stream_all(target, into=tensors, http=http))
        return Loaded(tensors, tensor_bytes(tensors), first=first)

    return load


def runai_load(files: list[str]) -> Prepared:
    """runai's ``SafetensorsStreamer`` over the files: paths or ``s3://`` URLs."""
    import inspect

    from runai_model_streamer import SafetensorsStreamer

    # Before 0.17 the streamer yielded views of buffers it reuses, so a kept
    # tensor had to be cloned. Since then stream_files(owned=True), the default,
    # hands each buffer to the caller; cloning then would only add a copy.
    clone = "owned" not in inspect.signature(SafetensorsStreamer.stream_files).parameters

    def load() -> Loaded:
        tensors: dict[str, Any] = {}
        first = None
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files)
            for name, tensor in streamer.get_tensors():
                tensors[name] = tensor.clone() if clone else tensor
                if first is None:
                    first = time.perf_counter()
        return Loaded(tensors, tensor_bytes(tensors), first=first)

    return load
