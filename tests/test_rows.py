"""``rows=``: some rows of the first dimension of some tensors, and only their bytes.

Every result is compared bit for bit with the same rows of
``safetensors.torch.load_file``; the HTTP server counts the bytes it sent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from aioloader import Loader, SelectionError, load_model, split_rows
from aioloader.devices.staged import HostCopyEngine

from .helpers import assert_same, write_file
from .servers import FaultyHttpServer

ROW = 4096 * 4  # bytes per row of "big": 4096 float32


def model(path: Path) -> Path:
    gen = torch.Generator().manual_seed(7)
    return write_file(
        path,
        {
            "big": torch.randn(256, 4096, generator=gen),  # 4 MiB
            "bias": torch.randn(4096, generator=gen),
            "half": torch.randn(96, 40, generator=gen).to(torch.bfloat16),
            "step": torch.tensor(5, dtype=torch.int64),
        },
    )


def expected(path: Path, rows: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    reference = load_file(path)
    for name, (start, stop) in rows.items():
        reference[name] = reference[name][start:stop]
    return reference


@pytest.mark.parametrize("device", ["cpu", "staged"])
async def test_rows_of_some_tensors_and_the_others_whole(tmp_path: Path, device: str) -> None:
    path = model(tmp_path / "m.safetensors")
    rows: dict[str, Any] = {"big": (32, 96), "half": slice(90, 96)}
    target: Any = HostCopyEngine() if device == "staged" else "cpu"
    async with Loader(device=target, chunk_size="256KiB") as loader:
        got = await loader.load(str(path), rows=rows)
    assert got["big"].shape == (64, 4096)
    assert_same(got, expected(path, {"big": (32, 96), "half": (90, 96)}))


async def responses_done(server: FaultyHttpServer) -> None:
    """Wait until the server has finished its responses. It counts a piece after
    writing it, which can be after the client has read it and moved on: a count
    taken then misses that piece (and a reset then counts it for the next load)."""
    for _ in range(2000):  # 10 s at most
        if not server.in_flight:
            return
        await asyncio.sleep(0.005)


async def test_only_the_asked_rows_cross_the_network(tmp_path: Path) -> None:
    with FaultyHttpServer(tmp_path / "www") as server:
        path = model(server.root / "m.safetensors")
        url = server.url_for("m.safetensors")
        async with Loader(cache_dir=False) as loader:
            await loader.inspect(url)
            await responses_done(server)
            header = server.bytes_sent  # what opening the file costs
            server.reset_counters()
            got = await loader.load(url, tensors=["big"], rows={"big": (100, 108)})
            await responses_done(server)
            sent = server.bytes_sent - header
    assert_same(got, {"big": load_file(path)["big"][100:108]})
    assert 8 * ROW <= sent <= 8 * ROW + 2 * 4096, sent  # 8 rows, widened to 4 KiB blocks


async def test_split_rows_gives_each_rank_its_share(tmp_path: Path) -> None:
    path = model(tmp_path / "m.safetensors")
    reference = load_file(path)
    parts = [await load_model(str(path), rows=split_rows(rank, 4)) for rank in range(4)]
    for name in ("big", "half"):  # two dimensions: split
        assert [p[name].shape[0] for p in parts] == [reference[name].shape[0] // 4] * 4
        assert torch.equal(torch.cat([p[name] for p in parts]), reference[name])
    for name in ("bias", "step"):  # one dimension or none: whole on every rank
        assert all(torch.equal(p[name], reference[name]) for p in parts)


async def test_no_rows_is_an_empty_tensor(tmp_path: Path) -> None:
    path = model(tmp_path / "m.safetensors")
    got = await load_model(str(path), tensors=["big"], rows={"big": (10, 10)})
    assert got["big"].shape == (0, 4096) and got["big"].dtype == torch.float32


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ({"bigg": (0, 1)}, ["'bigg'", "did you mean 'big'", "m.safetensors"]),
        ({"big": (0, 257)}, ["rows [0, 257)", "'big'", "[256, 4096]", "<= 256"]),
        ({"big": (5, 4)}, ["rows [5, 4)", "'big'"]),
        ({"step": (0, 1)}, ["'step'", "scalar"]),
        ({"big": slice(0, 10, 2)}, ["'big'", "step"]),
        ({"big": (0.5, 3)}, ["'big'", "two integers"]),
        (split_rows(0, 3), ["'big'", "256 rows", "3 ranks", "m.safetensors"]),
    ],
)
async def test_bad_rows_are_refused_naming_the_tensor(
    tmp_path: Path, rows: Any, words: list[str]
) -> None:
    path = model(tmp_path / "m.safetensors")
    with pytest.raises(SelectionError) as caught:
        await load_model(str(path), rows=rows)
    for word in words:
        assert word in str(caught.value)


def test_split_rows_checks_its_rank() -> None:
    with pytest.raises(ValueError, match="rank"):
        split_rows(2, 2)


async def test_rows_through_the_node_cache(tmp_path: Path) -> None:
    """Rows leave the cache entry partial; a later full load completes it, and rows are
    then read from it."""
    with FaultyHttpServer(tmp_path / "www") as server:
        path = model(server.root / "m.safetensors")
        url = server.url_for("m.safetensors")
        async with Loader(cache_dir=tmp_path / "cache") as loader:
            first = await loader.load(url, rows={"big": (0, 8), "half": (8, 16)})
            whole = await loader.load(url)
            await loader.load(url)  # from the completed entry
            server.reset_counters()
            again = await loader.load(url, rows={"big": (250, 256)})
            gets = len(server.gets())
    assert_same(first, expected(path, {"big": (0, 8), "half": (8, 16)}))
    assert_same(whole, load_file(path))
    assert_same(again, expected(path, {"big": (250, 256)}))
    assert gets == 1  # the version probe; the rows came from the cache
