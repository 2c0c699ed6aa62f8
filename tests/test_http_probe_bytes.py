"""Opening an HTTP file reads its first 256 KiB (the probe: size, version, header);
those bytes are not asked for again. A fetch or a load of a file takes exactly its
size from the server, which a fleet's origin budget (1.05x of the model) counts on.
Inside ``opening.lean()`` (a swarm puller of one range) the probe reads one byte.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import aioloader
from aioloader.settings.options import LoadOptions
from aioloader.sources.http.rules import PROBE_SIZE
from aioloader.sources.opening import lean, probe_size
from aioloader.sources.stores import Stores, locate

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


async def _lean_read(server: FaultyHttpServer, name: str, offset: int, length: int) -> bytes:
    url = server.url_for(name)
    stores = Stores(LoadOptions.build())
    try:
        with lean():
            blob = await stores.source(locate(url)).open(url)
        assert probe_size() == PROBE_SIZE  # lean() is over
        try:
            buffer = bytearray(length)
            await blob.read_into(offset, [memoryview(buffer)])
            return bytes(buffer)
        finally:
            await blob.aclose()
    finally:
        await stores.aclose()


@pytest.mark.parametrize("offset", [0, 1, 3 << 20])
async def test_a_lean_open_reads_the_first_byte_and_then_only_the_range_asked(
    http_server: FaultyHttpServer, offset: int
) -> None:
    data = os.urandom(4 << 20)
    (http_server.root / "w.bin").write_bytes(data)
    got = await _lean_read(http_server, "w.bin", offset, 1 << 20)
    assert got == data[offset : offset + (1 << 20)]
    gets = http_server.gets("w.bin")
    assert gets[0].range == "bytes=0-0"
    # The probe's byte is not asked for again where the range starts with it.
    assert http_server.bytes_sent == (1 << 20) + (offset > 0)


async def test_a_lean_open_of_a_server_that_ignores_range_reads_the_file_as_a_stream(
    http_server: FaultyHttpServer,
) -> None:
    data = os.urandom(2 << 20)
    (http_server.root / "w.bin").write_bytes(data)
    http_server.ignore_range("w.bin")
    got = await _lean_read(http_server, "w.bin", 1 << 20, 1 << 19)
    assert got == data[1 << 20 : (1 << 20) + (1 << 19)]


@pytest.mark.parametrize("size", [0, 1, 2])
async def test_a_lean_open_of_a_tiny_file(http_server: FaultyHttpServer, size: int) -> None:
    data = os.urandom(size)
    (http_server.root / "w.bin").write_bytes(data)
    assert await _lean_read(http_server, "w.bin", 0, size) == data
