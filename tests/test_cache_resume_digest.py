"""A download resumed from a ``data.partial`` an earlier run left (issue 42): the digest
the publisher gives of the whole file covers the prefix already on disk too, read back
from the disk, so bytes that changed there between the two runs are refused, never
committed; the next fetch downloads the file again and holds the publisher's bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load, load_file

from aioloader import CacheError, ModelCache

from . import test_hf
from .helpers import flip_byte, some_big, write_sharded

hub = test_hf.hub


def _back_to_partial(entry: Path, keep: int) -> None:
    """Make a complete entry the partial download an earlier run left: its bytes in
    ``data.partial``, a journal vouching for the first ``keep`` bytes, not complete."""
    meta = json.loads((entry / "meta.json").read_text())
    meta.update(complete=False, checksum=None)
    (entry / "meta.json").write_text(json.dumps(meta))
    os.replace(entry / "data", entry / "data.partial")
    (entry / "data.ranges").write_text(f"0 {keep}\n")


async def test_a_resumed_prefix_changed_on_disk_is_caught_by_the_hubs_sha256(
    hub: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "src"
    write_sharded(folder, some_big(3), shards=2)
    hub.commit("org/m", {p.name: p.read_bytes() for p in folder.iterdir()})
    root = tmp_path / "cache"
    await ModelCache(root).fetch("hf://org/m")
    (shard,) = [
        e for e in ModelCache(root).entries() if e.url.endswith("00001-of-00002.safetensors")
    ]
    original = (folder / "model-00001-of-00002.safetensors").read_bytes()
    _back_to_partial(Path(shard.path), keep=shard.size // 2)
    flip_byte(
        Path(shard.path) / "data.partial", shard.size // 4
    )  # inside the prefix it vouches for

    with pytest.raises(CacheError) as caught:
        await ModelCache(root).fetch("hf://org/m")
    message = str(caught.value)
    assert "sha256" in message and "00001-of-00002.safetensors" in message, message
    assert not (Path(shard.path) / "data").exists(), "the corrupt bytes were never committed"
    assert [e.complete for e in ModelCache(root).entries() if e.url == shard.url] in ([], [False])

    # The next fetch downloads it again, whole, and holds the Hub's bytes.
    await ModelCache(root).fetch("hf://org/m")
    assert (Path(shard.path) / "data").read_bytes() == original
    got, want = load_file(str(Path(shard.path) / "data")), load(original)
    assert got.keys() == want.keys()
    assert all(got[k].view(-1).view(got[k].dtype).equal(want[k].view(-1)) for k in want)
    assert [r.status for r in await ModelCache(root).verify(shard.url)] == ["ok"]


async def test_a_resumed_prefix_left_as_it_was_completes_from_what_is_missing(
    hub: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "src"
    write_sharded(folder, some_big(4), shards=2)
    hub.commit("org/m", {p.name: p.read_bytes() for p in folder.iterdir()})
    root = tmp_path / "cache"
    await ModelCache(root).fetch("hf://org/m")
    (shard,) = [e for e in ModelCache(root).entries() if e.url.endswith(".safetensors")][:1]
    _back_to_partial(Path(shard.path), keep=shard.size // 2)
    fetched = await ModelCache(root).fetch("hf://org/m")
    assert 0 < fetched.downloaded <= shard.size - shard.size // 2 + (1 << 20)
    name = shard.url.rsplit("/", 1)[-1]
    assert (Path(shard.path) / "data").read_bytes() == (folder / name).read_bytes()


async def test_a_partial_file_the_journal_vouches_for_whole_is_checked_too(
    hub: Any, tmp_path: Path
) -> None:
    """Nothing left to download: the entry would be committed from the disk alone."""
    folder = tmp_path / "src"
    write_sharded(folder, some_big(5), shards=2)
    hub.commit("org/m", {p.name: p.read_bytes() for p in folder.iterdir()})
    root = tmp_path / "cache"
    await ModelCache(root).fetch("hf://org/m")
    shard = next(e for e in ModelCache(root).entries() if e.url.endswith(".safetensors"))
    _back_to_partial(Path(shard.path), keep=shard.size)
    flip_byte(Path(shard.path) / "data.partial", shard.size - 1)
    with pytest.raises(CacheError, match="changed on disk"):
        await ModelCache(root).fetch("hf://org/m")
    assert not (Path(shard.path) / "data").exists()
    fetched = await ModelCache(root).fetch("hf://org/m")
    assert fetched.downloaded >= shard.size
    name = shard.url.rsplit("/", 1)[-1]
    assert (Path(shard.path) / "data").read_bytes() == (folder / name).read_bytes()
