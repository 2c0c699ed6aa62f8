"""The test data: Llama-shaped BF16 checkpoints, written once and reused."""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import BF16, FILL_BLOCK, ONE_TENSOR_SHAPE, SHARDS, SMALL_BYTES, VOCAB, GiB


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * BF16


@dataclass(frozen=True)
class FilePlan:
    path: Path
    tensors: tuple[TensorSpec, ...]

    @property
    def header(self) -> bytes:
        return safetensors_header(self.tensors)

    @property
    def data_size(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def size(self) -> int:
        return len(self.header) + self.data_size


@dataclass(frozen=True)
class Dataset:
    """A checkpoint on disk: ``target`` is what the loaders are pointed at."""

    name: str
    target: Path
    files: tuple[FilePlan, ...]

    @property
    def paths(self) -> list[Path]:
        return [f.path for f in self.files]

    @property
    def tensor_bytes(self) -> int:
        return sum(f.data_size for f in self.files)


def llama_intermediate(hidden: int) -> int:
    """The MLP width Llama derives from the hidden size (8/3 h, rounded up to 256)."""
    return 256 * math.ceil(int(8 * hidden / 3) / 256)


def llama_layer(i: int, hidden: int) -> list[TensorSpec]:
    inter = llama_intermediate(hidden)
    p = f"model.layers.{i}"
    return [
        TensorSpec(f"{p}.input_layernorm.weight", (hidden,)),
        TensorSpec(f"{p}.self_attn.q_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.self_attn.k_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.self_attn.v_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.self_attn.o_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.post_attention_layernorm.weight", (hidden,)),
        TensorSpec(f"{p}.mlp.gate_proj.weight", (inter, hidden)),
        TensorSpec(f"{p}.mlp.up_proj.weight", (inter, hidden)),
        TensorSpec(f"{p}.mlp.down_proj.weight", (hidden, inter)),
    ]


def llama_shape(size: int) -> tuple[int, int]:
    """(hidden, layers) of a Llama of about ``size`` bytes: the widest with 16+ layers."""
    for hidden in (8192, 5120, 4096, 3072, 2048, 1024, 512):
        fixed = 2 * VOCAB * hidden * BF16 + hidden * BF16  # embed_tokens, lm_head, norm
        per_layer = sum(t.nbytes for t in llama_layer(0, hidden))
        layers = max(1, round((size - fixed) / per_layer))
        if layers >= 16:
            break
    return hidden, layers


def llama_tensors(size: int) -> list[TensorSpec]:
    hidden, layers = llama_shape(size)
    tensors = [TensorSpec("model.embed_tokens.weight", (VOCAB, hidden))]
    for i in range(layers):
        tensors += llama_layer(i, hidden)
    tensors.append(TensorSpec("model.norm.weight", (hidden,)))
    tensors.append(TensorSpec("lm_head.weight", (VOCAB, hidden)))
    return tensors


def split_shards(tensors: Sequence[TensorSpec], count: int) -> list[list[TensorSpec]]:
    """Consecutive groups of about equal bytes, in order; none empty."""
    total = sum(t.nbytes for t in tensors)
    shards: list[list[TensorSpec]] = [[] for _ in range(count)]
    done = 0
    for t in tensors:
        shards[min(count - 1, done * count // total)].append(t)
        done += t.nbytes
    return [s for s in shards if s]


def safetensors_header(tensors: Sequence[TensorSpec]) -> bytes:
    """The 8-byte length, then the JSON header padded to 8 bytes, tensors back to back."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": "BF16",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def model_dataset(out: Path, size_gib: float) -> Dataset:
    folder = out / f"llama-{size_gib:g}gib"
    shards = split_shards(llama_tensors(int(size_gib * GiB)), SHARDS)
    files = tuple(
        FilePlan(folder / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors", tuple(s))
        for i, s in enumerate(shards)
    )
    return Dataset("model", folder, files)


def small_dataset(out: Path) -> Dataset:
    """A small model in one file, the size of all-MiniLM-L6-v2 (87 MB): at this size a
    load's fixed cost (threads, headers, allocation) shows next to its bytes."""
    path = out / "small" / "model.safetensors"
    plan = FilePlan(path, tuple(llama_tensors(SMALL_BYTES)))
    return Dataset("small", path, (plan,))


def one_tensor_dataset(out: Path) -> Dataset:
    path = out / "one-tensor" / "model.safetensors"
    plan = FilePlan(path, (TensorSpec("weight", ONE_TENSOR_SHAPE),))
    return Dataset("one-tensor", path, (plan,))


def index_json(dataset: Dataset) -> dict[str, Any]:
    weight_map = {t.name: f.path.name for f in dataset.files for t in f.tensors}
    return {"metadata": {"total_size": dataset.tensor_bytes}, "weight_map": weight_map}


def is_complete(dataset: Dataset) -> bool:
    return all(f.path.is_file() and f.path.stat().st_size == f.size for f in dataset.files)


def filler(size: int, block: bytes) -> Iterator[memoryview]:
    """``size`` bytes of ``block`` repeated, rotated on each pass so no two 4 KiB pages repeat."""
    view = memoryview(block)
    rotation = 0
    while size > 0:
        start = rotation % len(view)
        for piece in (view[start:], view[:start]):
            piece = piece[:size]
            size -= len(piece)
            if piece:
                yield piece
        rotation += 1_000_003


def write_safetensors(plan: FilePlan, block: bytes) -> None:
    """Stream the file to disk (never whole in memory), fsync it, then move it into place."""
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    unfinished = plan.path.with_name(plan.path.name + ".partial")
    with open(unfinished, "wb") as f:
        f.write(plan.header)
        for piece in filler(plan.data_size, block):
            f.write(piece)
        f.flush()
        os.fsync(f.fileno())
    os.replace(unfinished, plan.path)


def ensure_dataset(dataset: Dataset, block: Callable[[], bytes]) -> None:
    if is_complete(dataset):
        print(f"  {dataset.target}: present, reused")
        return
    start = time.perf_counter()
    for plan in dataset.files:
        write_safetensors(plan, block())
    if dataset.target.is_dir():
        index = dataset.target / "model.safetensors.index.json"
        index.write_text(json.dumps(index_json(dataset), indent=2) + "\n")
    size = sum(f.size for f in dataset.files)
    print(f"  {dataset.target}: wrote {size / GiB:.2f} GiB in {time.perf_counter() - start:.1f}s")


def prepare_data(out: Path, size_gib: float, names: set[str]) -> dict[str, Dataset]:
    datasets = {
        "model": model_dataset(out, size_gib),
        "one-tensor": one_tensor_dataset(out),
        "small": small_dataset(out),
    }
    cache: list[bytes] = []

    def block() -> bytes:
        if not cache:
            cache.append(random.Random(0).randbytes(FILL_BLOCK))
        return cache[0]

    print("test data:")
    for name in sorted(names):
        ensure_dataset(datasets[name], block)
    return datasets
