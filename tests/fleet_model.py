"""Model data for fleet tests and the fleet benchmark: real safetensors shards and
their index, written with the ``safetensors`` library."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Model", "digest", "write_model"]


@dataclass(frozen=True)
class Model:
    """A sharded safetensors model in ``folder``: its index and shard files."""

    folder: Path
    index: Path
    shards: tuple[Path, ...]

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.index, *self.shards)

    @property
    def size(self) -> int:
        """Bytes of every file, the index included: what one full download reads."""
        return sum(p.stat().st_size for p in self.files)

    def relpath(self, path: Path, root: Path) -> str:
        return path.relative_to(root).as_posix()


def write_model(folder: Path, size: int, shards: int = 4, seed: int = 0) -> Model:
    """About ``size`` bytes of float16 tensors in ``shards`` safetensors files (each
    holding four tensors), and ``model.safetensors.index.json``."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_tensor = max(1, size // (shards * 4 * 2))
    weight_map: dict[str, str] = {}
    paths = []
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {
            f"layers.{s}.{t}.weight": rng.integers(0, 1 << 16, per_tensor, dtype=np.uint16).view(
                np.float16
            )
            for t in range(4)
        }
        save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
        paths.append(folder / name)
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return Model(folder, index, tuple(paths))


def digest(path: Path) -> str:
    """The SHA-256 of a file (remembered while its size and mtime stay the same)."""
    st = path.stat()
    return _digest(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
