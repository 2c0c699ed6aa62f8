"""The node-local model cache, against a real HTTP server with faults and moto's S3.

Upstream traffic is measured at the server (``requests``, ``bytes_sent``): a warm load
may only send the probe of each file (``bytes=0-262143``: size and ETag), never its data.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from aioloader import (
    CacheError,
    HttpOptions,
    Loader,
    ModelCache,
    ReadError,
    load_model,
)
from aioloader.cache.entry import key_of
from aioloader.reads.ranges import RangeSet, split
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_matches_files, assert_same, random_tensors, write_file, write_sharded
from .servers import FaultyHttpServer, MotoS3Server

FAST = HttpOptions(backoff=0.01, backoff_max=0.05, stall_timeout=2.0)
PROBE = f"bytes=0-{PROBE_SIZE - 1}"


def big_tensors(count: int = 8, numel: int = 64 * 1024, seed: int = 0) -> dict[str, torch.Tensor]:
    """Small tensors plus ``count`` of ``numel`` float32 (256 KiB each by default)."""
    gen = torch.Generator().manual_seed(seed)
    out = random_tensors(seed=seed, count=6)
    for i in range(count):
        out[f"big.{i:02d}"] = torch.randn(numel, generator=gen)
    return out


def data_gets(server: FaultyHttpServer) -> list[str | None]:
    """Ranges of the GETs that were not a file's first probe."""
    return [r.range for r in server.gets() if r.range != PROBE]


def entry_dir(root: Path, url: str) -> Path:
    return root / "entries" / key_of(url)


def meta_of(root: Path, url: str) -> dict[str, object]:
    return json.loads((entry_dir(root, url) / "meta.json").read_text())  # type: ignore[no-any-return]


# -- the pure part -----------------------------------------------------------------------


def test_range_set() -> None:
    ranges = RangeSet([(10, 20), (0, 5), (5, 10), (30, 40)])
    assert list(ranges) == [(0, 20), (30, 40)]
    assert ranges.total == 30
    assert ranges.covers(2, 18) and not ranges.covers(15, 31) and ranges.covers(7, 7)
    assert ranges.missing(50) == [(20, 30), (40, 50)]
    assert RangeSet().missing(3) == [(0, 3)]
    assert split([(0, 10), (20, 25)], 4) == [(0, 4), (4, 8), (8, 10), (20, 24), (24, 25)]


# -- loads through the cache -------------------------------------------------------------


async def test_cold_load_fills_the_cache_and_warm_load_reads_no_data(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    index = write_sharded(http_server.root / "m", big_tensors(), shards=3)
    shards = sorted(index.parent.glob("*.safetensors"))
    url = http_server.url_for("m/model.safetensors.index.json")
    root = tmp_path / "cache"

    got = await load_model(url, cache_dir=root, chunk_size="128KiB")
    assert_matches_files(got, *shards)
    await ModelCache(root).wait_committed()
    entries = ModelCache(root).entries()
    assert len(entries) == 4 and all(e.complete for e in entries)
    for shard in shards:
        data = entry_dir(root, http_server.url_for(f"m/{shard.name}")) / "data"
        assert data.read_bytes() == shard.read_bytes()
        assert not data.with_name("data.partial").exists()

    http_server.reset_counters()
    async with Loader(cache_dir=root, chunk_size="128KiB") as loader:
        got = await loader.load(url)
        stats = loader.statistics().cache
    assert_matches_files(got, *shards)
    assert data_gets(http_server) == []  # only the probes
    assert len(http_server.gets()) == 4
    assert stats.hits == 4 and stats.misses == 0


async def test_fetch_then_load_the_local_copy(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    index = write_sharded(http_server.root / "m", big_tensors(), shards=2)
    shards = sorted(index.parent.glob("*.safetensors"))
    url = http_server.url_for("m/model.safetensors.index.json")
    cache = ModelCache(tmp_path / "cache")
    seen: list[tuple[int, int]] = []

    model = await cache.fetch(url, chunk_size="256KiB", progress=lambda d, t: seen.append((d, t)))
    total = sum(p.stat().st_size for p in [index, *shards])
    assert not model.hit and model.bytes == total and model.downloaded == total
    assert seen[-1] == (total, total)
    assert isinstance(model.path, str) and model.path.endswith("model.safetensors.index.json")
    async with model.use():
        assert_matches_files(await load_model(model.path), *shards)

    http_server.reset_counters()
    again = await cache.fetch(url)
    assert again.hit and again.downloaded == 0 and again.path == model.path
    assert data_gets(http_server) == []
    assert cache.statistics().hits == 3

    single = await cache.fetch(http_server.url_for(f"m/{shards[0].name}"))
    assert single.hit and isinstance(single.path, str) and single.path.endswith(shards[0].name)
    assert_matches_files(await load_model(single.path), shards[0])


async def test_changed_remote_file_is_fetched_again(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    write_file(http_server.root / "m.safetensors", big_tensors())
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    await ModelCache(root).fetch(url)
    old_meta = meta_of(root, url)

    http_server.change_after("m.safetensors", 0)  # new ETag, different data bytes
    http_server.reset_counters()
    got = await load_model(url, cache_dir=root)
    assert data_gets(http_server)  # the stale entry was not used
    direct = await load_model(url, cache_dir=False)
    assert_same(got, direct)
    await ModelCache(root).wait_committed()  # the load commits its entry after it returns
    new_meta = meta_of(root, url)
    assert new_meta["complete"] and new_meta["etag"] != old_meta["etag"]

    http_server.reset_counters()
    assert_same(await load_model(url, cache_dir=root), direct)
    assert data_gets(http_server) == []


async def test_s3_through_the_cache_and_an_overwritten_object(
    s3_env: MotoS3Server, tmp_path: Path
) -> None:
    bucket = "cache-bucket"
    first = write_sharded(tmp_path / "v1", big_tensors(seed=1), shards=2)
    s3_env.upload(bucket, "llm", first.parent)
    root = tmp_path / "cache"
    url = f"s3://{bucket}/llm/"

    shards = sorted(first.parent.glob("*.safetensors"))
    assert_matches_files(await load_model(url, cache_dir=root), *shards)
    await ModelCache(root).wait_committed()
    assert all(e.complete for e in ModelCache(root).entries())
    cache = ModelCache(root)
    assert (await cache.fetch(url)).hit

    # The same keys, new contents: every entry is discarded and fetched again.
    second = write_sharded(tmp_path / "v2", big_tensors(seed=2), shards=2)
    s3_env.upload(bucket, "llm", second.parent)
    new_shards = sorted(second.parent.glob("*.safetensors"))
    model = await cache.fetch(url)
    # The index is the same bytes (same names and sizes), so only the shards are new.
    assert not model.hit and model.downloaded == sum(p.stat().st_size for p in new_shards)
    assert isinstance(model.path, str)
    assert_matches_files(await load_model(model.path), *new_shards)
    assert_matches_files(await load_model(url, cache_dir=root), *new_shards)


async def test_partial_load_leaves_a_resumable_entry(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=12))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    await load_model(url, cache_dir=root, tensors=["big.03"], chunk_size="128KiB")
    meta = meta_of(root, url)
    assert meta["complete"] is False
    assert not (entry_dir(root, url) / "data").exists()

    http_server.reset_counters()
    model = await ModelCache(root).fetch(url, chunk_size="128KiB")
    assert 0 < model.downloaded < path.stat().st_size
    assert_matches_files(await load_model(url, cache_dir=root), path)


# -- crashes, single flight, eviction ----------------------------------------------------


async def test_failed_download_resumes_with_only_the_missing_ranges(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=24))
    size = path.stat().st_size
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    cache = ModelCache(root)
    # The probe and 9 range GETs go through, the next one is cut before its first byte
    # (an attempt that made no progress) and not retried.
    http_server.stall("m.safetensors", 0, count=10)
    http_server.reset_after("m.safetensors", 0)
    once = HttpOptions(max_attempts=1, backoff=0.01, backoff_max=0.01)
    with pytest.raises(ReadError):
        await cache.fetch(url, chunk_size="256KiB", concurrency=2, http=once)

    entry = entry_dir(root, url)
    assert not (entry / "data").exists()  # never visible under the final name
    assert meta_of(root, url)["complete"] is False
    assert [e.complete for e in cache.entries()] == [False]
    journal = (entry / "data.ranges").read_text().split("\n")
    have = RangeSet(tuple(map(int, line.split())) for line in journal if line)  # type: ignore[misc]
    assert 0 < have.total < size

    http_server.clear_faults()
    http_server.reset_counters()
    model = await cache.fetch(url, chunk_size="256KiB", concurrency=2)
    assert model.downloaded == size - have.total
    assert http_server.bytes_sent <= size - have.total + PROBE_SIZE
    for header in data_gets(http_server):
        assert header is not None
        first, _, last = header[len("bytes=") :].partition("-")
        assert not any(s < int(last) + 1 and int(first) < e for s, e in have), (
            f"{header} was downloaded twice"
        )
    assert (entry / "data").read_bytes() == path.read_bytes()
    assert not (entry / "data.partial").exists() and not (entry / "data.ranges").exists()


async def test_concurrent_fetches_in_one_process_download_once(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=16))
    size = path.stat().st_size
    url = http_server.url_for("m.safetensors")
    one, other = ModelCache(tmp_path / "cache"), ModelCache(tmp_path / "cache")
    results = await asyncio.gather(
        one.fetch(url, chunk_size="256KiB"),
        one.fetch(url, chunk_size="256KiB"),
        one.fetch(url, chunk_size="256KiB"),
        other.fetch(url, chunk_size="256KiB"),  # another object: meets the flock
    )
    # The three calls on one object share one task, and so one result.
    assert results[0] is results[1] is results[2]
    assert results[0].downloaded + results[3].downloaded == size
    assert http_server.bytes_sent <= size + 2 * PROBE_SIZE
    assert_matches_files(await load_model(results[3].path), path)


async def test_concurrent_processes_download_once(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=32))
    size = path.stat().st_size
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    # Slow range GETs stretch the download past the other processes' start-up.
    http_server.stall("m.safetensors", 0.05, count=40, before_headers=True)
    code = (
        "import asyncio, sys; from aioloader import ModelCache; "
        "m = asyncio.run(ModelCache(sys.argv[1]).fetch(sys.argv[2], chunk_size='256KiB', "
        "concurrency=4)); print(m.downloaded)"
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, str(root), url, stdout=asyncio.subprocess.PIPE
        )
        for _ in range(3)
    ]
    outputs = [await p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert sum(int(out) for out, _ in outputs) == size
    assert http_server.bytes_sent <= size + 3 * PROBE_SIZE
    assert (entry_dir(root, url) / "data").read_bytes() == path.read_bytes()


async def test_eviction_is_lru_and_spares_entries_in_use(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    urls = {}
    for name in "abcd":
        write_file(http_server.root / f"{name}.safetensors", big_tensors(count=4, seed=ord(name)))
        urls[name] = http_server.url_for(f"{name}.safetensors")
    size = (http_server.root / "a.safetensors").stat().st_size
    cache = ModelCache(tmp_path / "cache", max_bytes=int(size * 2.5))

    a = await cache.fetch(urls["a"])
    await cache.fetch(urls["b"])
    async with a.use():  # "a" is the least recently used, but being read
        await cache.fetch(urls["c"])
        held = {e.url for e in cache.entries() if e.complete}
    assert held == {urls["a"], urls["c"]}  # "b" went instead
    d = await cache.fetch(urls["d"])  # now "a" is free and the oldest
    assert {e.url for e in cache.entries() if e.complete} == {urls["c"], urls["d"]}
    # The evicted models' link folders went with their entries; the others remain.
    links = [p for p in (tmp_path / "cache" / "models").rglob("*") if p.is_symlink()]
    assert sorted(p.resolve() for p in links) == sorted(
        Path(cache.entry_files(urls[n]).data).resolve() for n in "cd"
    )
    assert Path(str(d.path)).is_file()
    assert cache.statistics().evictions == 2
    assert sum(e.bytes_on_disk for e in cache.entries()) <= cache.max_bytes  # type: ignore[operator]
    with pytest.raises(CacheError, match="evicted"):
        async with a.use():
            pass


async def test_remove_and_entries(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    write_file(http_server.root / "m.safetensors", big_tensors(count=2))
    url = http_server.url_for("m.safetensors")
    cache = ModelCache(tmp_path / "cache")
    model = await cache.fetch(url)
    [entry] = cache.entries()
    assert entry.url == url and entry.complete and entry.bytes_on_disk >= entry.size
    async with model.use():
        with pytest.raises(CacheError, match="being read"):
            await cache.remove(url)
    assert await cache.remove(url)
    assert cache.entries() == [] and not await cache.remove(url)
    assert not Path(str(model.path)).exists() and not Path(str(model.path)).is_symlink()
    assert list((tmp_path / "cache" / "models").iterdir()) == []
    again = await cache.fetch(url)  # links again
    assert Path(str(again.path)).read_bytes() == (http_server.root / "m.safetensors").read_bytes()


# -- configuration and failures ----------------------------------------------------------


async def test_cache_dir_from_the_environment(
    http_server: FaultyHttpServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=2))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "env-cache"
    monkeypatch.setenv("AIOLOADER_CACHE_DIR", str(root))
    assert_matches_files(await load_model(url, cache_dir=False), path)
    assert not root.exists()
    assert_matches_files(await load_model(url), path)
    await ModelCache(root).wait_committed()
    assert [e.complete for e in ModelCache(root).entries()] == [True]


async def test_unwritable_cache_dir_is_a_clear_error(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    write_file(http_server.root / "m.safetensors", big_tensors(count=2))
    url = http_server.url_for("m.safetensors")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file")  # fails for root too, unlike chmod
    root = blocker / "cache"
    with pytest.raises(CacheError) as info:
        await load_model(url, cache_dir=root)
    assert str(root) in str(info.value) and "cache_dir=False" in str(info.value)
    with pytest.raises(CacheError, match=str(root)):
        await ModelCache(root).fetch(url)


async def test_full_disk_is_a_clear_error_and_never_complete(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    write_file(http_server.root / "m.safetensors", big_tensors(count=16))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    # A file size limit stands in for a full disk: writes past it fail with EFBIG.
    code = (
        "import asyncio, resource, sys; from aioloader import ModelCache, CacheError\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
        "try:\n"
        "    asyncio.run(ModelCache(sys.argv[1]).fetch(sys.argv[2]))\n"
        "except CacheError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(root), url, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 3, out
    assert str(root) in out.decode() and "free space" in out.decode()
    entry = entry_dir(root, url)
    assert not (entry / "data").exists()
    meta = entry / "meta.json"
    assert not meta.exists() or json.loads(meta.read_text())["complete"] is False
    # Once there is room, the same cache works.
    model = await ModelCache(root).fetch(url)
    assert model.downloaded == model.bytes
    assert os.path.getsize(entry / "data") == model.bytes


async def test_cancelled_fetch_releases_the_entry_and_resumes(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=16))
    url = http_server.url_for("m.safetensors")
    cache = ModelCache(tmp_path / "cache")
    http_server.stall("m.safetensors", 0, count=4)  # the probe and 3 ranges go through
    http_server.stall("m.safetensors", 5.0, before_headers=True, count=10)
    started = asyncio.Event()

    def progress(done: int, total: int) -> None:
        if done >= 2 * 256 * 1024:
            started.set()

    task = asyncio.get_running_loop().create_task(
        cache.fetch(url, chunk_size="256KiB", concurrency=1, progress=progress)
    )
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(0.2)  # the next range GET is now stalled
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cache.statistics().fetches_in_flight == 0
    assert [e.complete for e in cache.entries()] == [False]

    http_server.clear_faults()
    model = await asyncio.wait_for(cache.fetch(url, chunk_size="256KiB"), 10)
    assert 0 < model.downloaded < path.stat().st_size  # the lock was free, the bytes kept
    assert_matches_files(await load_model(url, cache_dir=cache), path)


async def test_load_waits_for_another_process_downloading_the_same_file(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=32))
    size = path.stat().st_size
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    http_server.stall("m.safetensors", 0.05, count=40, before_headers=True)
    code = (
        "import asyncio, sys; from aioloader import ModelCache; "
        "asyncio.run(ModelCache(sys.argv[1]).fetch(sys.argv[2], chunk_size='256KiB', "
        "concurrency=4))"
    )
    fetcher = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(root), url)
    # Start loading once the other process holds the entry's download lock.
    lock = entry_dir(root, url) / "lock"
    for _ in range(200):
        if lock.exists() and data_gets(http_server):
            break
        await asyncio.sleep(0.05)
    got = await load_model(url, cache_dir=root, http=FAST)
    assert await fetcher.wait() == 0
    assert_matches_files(got, path)
    # One download between the two: the load read the other process's copy.
    assert http_server.bytes_sent <= size + 3 * PROBE_SIZE
