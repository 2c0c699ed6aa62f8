"""Builders for real safetensors files and a bit-for-bit comparison with the reference."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's bytes as safetensors stores them (dtype-agnostic)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def assert_same(got: Mapping[str, Any], reference: Mapping[str, torch.Tensor]) -> None:
    """Every tensor equal in name, dtype, shape and every byte."""
    assert set(got) == set(reference), (sorted(set(got) ^ set(reference)))[:10]
    for name, want in reference.items():
        have = got[name]
        assert isinstance(have, torch.Tensor), name
        assert have.dtype == want.dtype, (name, have.dtype, want.dtype)
        assert tuple(have.shape) == tuple(want.shape), (name, have.shape, want.shape)
        assert raw_bytes(have) == raw_bytes(want), f"bytes of {name!r} differ"


def assert_matches_files(got: Mapping[str, Any], *files: Path) -> None:
    """Compare with ``safetensors.torch.load_file`` of each file."""
    reference: dict[str, torch.Tensor] = {}
    for path in files:
        reference.update(load_file(str(path)))
    assert_same(got, reference)


def random_tensors(seed: int = 0, count: int = 12, big: int = 0) -> dict[str, torch.Tensor]:
    """Mixed shapes and dtypes; ``big`` adds one tensor of that many float32 elements."""
    gen = torch.Generator().manual_seed(seed)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8]
    out: dict[str, torch.Tensor] = {}
    for i in range(count):
        dtype = dtypes[i % len(dtypes)]
        shape = (1 + (i * 7) % 13, 1 + (i * 5) % 17)
        t = (
            torch.randint(-100, 100, shape, generator=gen)
            if not dtype.is_floating_point
            else (torch.randn(shape, generator=gen))
        )
        if dtype == torch.uint8:
            t = t.abs()
        out[f"layer.{i}.weight"] = t.to(dtype)
    if big:
        out["big.weight"] = torch.randn(big, generator=gen)
    return out


def some_big(seed: int) -> dict[str, torch.Tensor]:
    """``random_tensors`` plus four float32 tensors of 1.2 MB: loads that need many reads."""
    gen = torch.Generator().manual_seed(seed)
    tensors = random_tensors(seed=seed)
    tensors.update({f"big.{i}": torch.randn(300_000, generator=gen) for i in range(4)})
    return tensors


def write_file(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(dict(tensors), str(path), metadata=metadata)
    return path


def write_sharded(folder: Path, tensors: Mapping[str, torch.Tensor], shards: int = 3) -> Path:
    """An HF-style sharded model with ``model.safetensors.index.json``; returns the index path."""
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_file(folder / shard, {n: tensors[n] for n in part})
        weight_map.update({n: shard for n in part})
    index = folder / "model.safetensors.index.json"
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return index


def write_raw(path: Path, header: Any, data: bytes = b"", *, length: int | None = None) -> Path:
    """A file with a hand-written header (for malformed inputs)."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    prefix = struct.pack("<Q", len(body) if length is None else length)
    path.write_bytes(prefix + body + data)
    return path


async def cancel_stream_after(loader: Any, url: str, ticks: int) -> None:
    """Stream ``url`` through ``loader`` and cancel the consumer after ``ticks`` loop turns."""
    import pytest

    async def consume() -> None:
        async with loader.stream(url) as stream:
            async for _ in stream:
                pass

    task = asyncio.create_task(consume())
    for _ in range(ticks):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def flip_byte(path: Path, at: int) -> None:
    """Change one byte of the file ``path`` in place: same size, other bytes (a cache
    entry made writable first, as it is kept read-only)."""
    path.chmod(0o600)
    with path.open("r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 0xFF]))
