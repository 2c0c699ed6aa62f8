"""The staging ring and copy pipeline, run into host memory through the GPU's path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aioloader import ConfigError, FormatError, Loader, load_model
from aioloader.devices.staged import HostCopyEngine, StagedDevice

from .helpers import (
    assert_matches_files,
    assert_same,
    cancel_stream_after,
    random_tensors,
    write_file,
    write_sharded,
)


def _ring(loader: Loader) -> StagedDevice:
    device = loader.device
    assert isinstance(device, StagedDevice)
    return device


async def test_bit_identical_through_the_ring(tmp_path: Path) -> None:
    index = write_sharded(tmp_path, random_tensors(count=30, big=300_000), shards=3)
    async with Loader(device=HostCopyEngine(), chunk_size="64KiB", memory_limit="1MiB") as loader:
        got = await loader.load(str(index))
        ring = _ring(loader).ring
    assert_matches_files(got, *sorted(tmp_path.glob("*.safetensors")))
    assert ring.in_use == 0
    assert ring.copies > ring.slots, "more reads than slots: slots were recycled"
    assert len(ring.slots_touched) <= ring.slots
    assert ring.peak_in_use <= ring.slots


async def test_ring_never_exceeds_memory_limit(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=50, big=2_000_000))
    async with Loader(
        device=HostCopyEngine(), chunk_size="64KiB", memory_limit="1MiB", concurrency=16
    ) as loader:
        async with loader.stream(str(path)) as stream:
            got = {name: t async for name, t in stream}
        device = _ring(loader)
        assert device.ring_bytes <= 1 << 20
        assert loader.statistics().budget.used == 0
    assert stream.report is not None and stream.report.peak_staging_bytes <= 1 << 20
    assert_matches_files(got, path)


async def test_tensor_larger_than_the_ring(tmp_path: Path) -> None:
    tensors = {"huge": torch.randn(1_000_000), "small": torch.ones(3)}  # 4 MB > 256 KiB ring
    path = write_file(tmp_path / "m.safetensors", tensors)
    async with Loader(device=HostCopyEngine(), chunk_size="64KiB", memory_limit="256KiB") as loader:
        got = await loader.load(str(path))
        assert _ring(loader).ring.copies >= 60
    assert_matches_files(got, path)


async def test_each_tensor_is_complete_when_handed_out(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=40, big=500_000))
    reference = load_file(str(path))
    async with Loader(device=HostCopyEngine(), chunk_size="16KiB", memory_limit="128KiB") as loader:
        async with loader.stream(str(path)) as stream:
            async for name, tensor in stream:
                # Checked at the moment it arrives, while other copies are running.
                assert_same({name: tensor}, {name: reference[name]})


@pytest.mark.parametrize("ticks", [0, 2, 5, 13, 40])
async def test_cancel_returns_every_slot(tmp_path: Path, ticks: int) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(big=2_000_000))
    async with Loader(device=HostCopyEngine(), chunk_size="64KiB", memory_limit="512KiB") as loader:
        await cancel_stream_after(loader, str(path), ticks)
        assert _ring(loader).ring.in_use == 0
        assert loader.statistics().budget.used == 0
        # The loader still works afterwards, on the same ring.
        assert_matches_files(await loader.load(str(path)), path)


async def test_report_splits_read_and_copy(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(big=1_000_000))
    async with Loader(device=HostCopyEngine(), chunk_size="64KiB", memory_limit="1MiB") as loader:
        async with loader.stream(str(path)) as stream:
            async for _ in stream:
                pass
    report = stream.report
    assert report is not None and report.device == "host-staged"
    assert report.copy_seconds > 0 and report.read_seconds > 0
    assert report.overlap > 0
    assert report.bottleneck in ("storage", "copy")


async def test_misaligned_tensor_is_refused_for_devices(tmp_path: Path) -> None:
    from .helpers import write_raw

    header = {
        "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [1, 5]},
    }
    path = write_raw(tmp_path / "m.safetensors", header, b"\0" * 5)
    with pytest.raises(FormatError, match=r"'b'.*element size"):
        await load_model(str(path), device=HostCopyEngine())
    # Host memory takes it as it is.
    assert_matches_files(await load_model(str(path)), path)


async def test_numpy_framework(tmp_path: Path) -> None:
    tensors = {"f": torch.randn(4, 5), "i": torch.arange(7), "b": torch.tensor([True, False])}
    path = write_file(tmp_path / "m.safetensors", tensors)
    got = await load_model(str(path), framework="numpy")
    for name, want in tensors.items():
        assert isinstance(got[name], np.ndarray)
        assert got[name].tobytes() == want.numpy().tobytes() and got[name].shape == want.shape


async def test_numpy_cannot_hold_bf16(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", {"w": torch.ones(2, dtype=torch.bfloat16)})
    with pytest.raises(FormatError, match=r"'w' is BF16.*framework='torch'"):
        await load_model(str(path), framework="numpy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
async def test_cuda_without_a_gpu_says_so() -> None:
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        await load_model("/nonexistent", device="cuda")


@pytest.mark.parametrize(
    ("device", "framework"), [("cpu", "cupy"), ("cuda", "numpy"), ("cpu", "jax")]
)
async def test_bad_framework(device: str, framework: str) -> None:
    with pytest.raises(ConfigError):
        await load_model("/nonexistent", device=device, framework=framework)


@pytest.mark.gpu
async def test_cuda_bit_identical(tmp_path: Path) -> None:
    index = write_sharded(tmp_path, random_tensors(count=30, big=3_000_000), shards=2)
    got = await load_model(str(index), device="cuda", chunk_size="1MiB", memory_limit="8MiB")
    for path in sorted(tmp_path.glob("*.safetensors")):
        for name, want in load_file(str(path), device="cuda").items():
            assert got[name].device == want.device
            assert torch.equal(got[name].view(torch.uint8), want.view(torch.uint8)), name


async def test_ring_holds_two_slots_per_reader(tmp_path: Path) -> None:
    """Page-locking runs at a few GB/s: the ring is what keeps readers and the copy
    engine busy (one slot read into, one queued, per reader), not all of memory_limit."""
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=20, big=1_000_000))
    async with Loader(
        device=HostCopyEngine(), chunk_size="64KiB", memory_limit="8MiB", concurrency=4
    ) as loader:
        got = await loader.load(str(path))
        device = _ring(loader)
    assert device.ring.slots == 8 and device.ring_bytes == 8 * 64 * 1024
    assert device.ring.pinned_bytes == device.ring_bytes
    assert device.ring.peak_in_use <= 8
    assert_matches_files(got, path)


async def test_ring_is_pinned_only_when_a_read_needs_it(tmp_path: Path) -> None:
    path = write_file(
        tmp_path / "m.safetensors", {"empty": torch.ones(0), "none": torch.ones(0, 3)}
    )
    async with Loader(device=HostCopyEngine(), chunk_size="64KiB") as loader:
        got = await loader.load(str(path))
        assert _ring(loader).ring.pinned_bytes == 0
    assert_matches_files(got, path)


class _SlowCopies(HostCopyEngine):
    """Copies that lag behind the readers, so every slot fills and readers must wait."""

    def submit(self, source: Any, offset: int, target: Any, target_offset: int, nbytes: int) -> Any:
        def copy() -> None:
            time.sleep(0.002)
            target[target_offset : target_offset + nbytes] = source[offset : offset + nbytes]

        return self._stream.submit(copy)


async def test_readers_wait_for_a_free_slot(tmp_path: Path) -> None:
    # The budget admits 64 reads in flight; the ring has 4 slots (2 readers).
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=10, big=800_000))
    async with Loader(
        device=_SlowCopies(), chunk_size="16KiB", memory_limit="1MiB", concurrency=2
    ) as loader:
        got = await loader.load(str(path))
        ring = _ring(loader).ring
        assert loader.statistics().budget.used == 0
    assert ring.slots == 4 and ring.peak_in_use == 4, "every slot was in use at some point"
    assert ring.in_use == 0
    assert_matches_files(got, path)


@pytest.mark.parametrize("ticks", [0, 3, 11, 30])
async def test_cancel_while_readers_wait_for_slots(tmp_path: Path, ticks: int) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=10, big=800_000))
    async with Loader(
        device=_SlowCopies(), chunk_size="16KiB", memory_limit="1MiB", concurrency=2
    ) as loader:
        await cancel_stream_after(loader, str(path), ticks)
        assert _ring(loader).ring.in_use == 0
        assert loader.statistics().budget.used == 0
        assert_matches_files(await loader.load(str(path)), path)
