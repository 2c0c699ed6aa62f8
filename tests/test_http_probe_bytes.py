"""Opening an HTTP file reads its first 256 KiB (the probe: size, version, header);
those bytes are not asked for again. A fetch or a load of a file takes exactly its
size from the server, which a fleet's origin budget (1.05x of the model) counts on.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

import aioloader
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_same, write_file
from .http_server import FaultyHttpServer


def _model(root: Path) -> Path:
    gen = torch.Generator().manual_seed(3)
    # Small tensors first: the tensor data starts well inside the probe's bytes.
    tensors = {f"small.{i}": torch.randn(1000, generator=gen) for i in range(8)}
    tensors["z.big"] = torch.randn(600_000, generator=gen)  # 2.4 MB, after them, past the probe
    return write_file(root / "model.safetensors", tensors)


async def test_a_fetch_takes_each_byte_from_the_server_once(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = _model(http_server.root)
    assert path.stat().st_size > 4 * PROBE_SIZE
    cache = aioloader.ModelCache(tmp_path / "cache")
    cached = await cache.fetch(http_server.url_for("model.safetensors"), chunk_size=1 << 20)
    await cache.wait_committed()
    assert http_server.bytes_sent == path.stat().st_size
    assert cached.downloaded == path.stat().st_size
    got = await aioloader.load_model(cached.path, cache_dir=False)
    assert_same(got, load_file(str(path)))


async def test_a_load_takes_each_byte_from_the_server_once(
    http_server: FaultyHttpServer,
) -> None:
    path = _model(http_server.root)
    got = await aioloader.load_model(
        http_server.url_for("model.safetensors"), cache_dir=False, chunk_size=1 << 20
    )
    assert http_server.bytes_sent == path.stat().st_size
    assert_same(got, load_file(str(path)))


async def test_a_range_inside_the_probe_costs_no_request(
    http_server: FaultyHttpServer,
) -> None:
    path = _model(http_server.root)
    got = await aioloader.load_model(
        http_server.url_for("model.safetensors"), cache_dir=False, tensors=["small.0", "small.7"]
    )
    assert len(http_server.gets()) == 1  # the probe alone
    assert_same(got, {k: v for k, v in load_file(str(path)).items() if k in got})
    assert set(got) == {"small.0", "small.7"}
