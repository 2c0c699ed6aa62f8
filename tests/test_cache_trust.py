"""The node cache under ordinary hostile conditions: tensors changed in place, two loads
that want each other's entries, forked children, holders that hang, signed URLs.

A range may be served from the cache only once its bytes are proven to be the remote's;
no wait on another process is without a bound; no secret is written to the cache.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aioloader import CacheError, ConfigError, Loader, ModelCache, load_model
from aioloader.cache.entry import key_of
from aioloader.cache.locks import try_acquire

from .helpers import assert_matches_files, assert_same, random_tensors, write_file, write_sharded
from .servers import FaultyHttpServer, MotoS3Server


def twelve(seed: int = 0) -> dict[str, torch.Tensor]:
    """Twelve tensors of 1 MiB, each several 64 KiB reads, after a few small ones."""
    gen = torch.Generator().manual_seed(seed)
    out = random_tensors(seed=seed, count=4)
    for i in range(12):
        out[f"big.{i:02d}"] = torch.randn(256 * 1024, generator=gen)
    return out


def flip(tensor: torch.Tensor) -> None:
    """Change every byte of ``tensor`` in place, whatever its dtype."""
    tensor.view(-1).view(torch.uint8).bitwise_not_()


def held_by_other(path: Path) -> bool:
    """Whether someone holds an flock on ``path`` (tried from a descriptor of our own)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def entry_dir(root: Path, url: str) -> Path:
    return root / "entries" / key_of(url)


def digest_lines(root: Path, url: str) -> list[str]:
    journal = entry_dir(root, url) / "data.ranges"
    return [x for x in journal.read_text().splitlines() if len(x.split()) == 3]


# -- 1. tensors changed in place ---------------------------------------------------------


@pytest.mark.parametrize("how", ["subset", "left early"])
async def test_tensors_changed_in_place_are_never_served_from_the_cache(
    http_server: FaultyHttpServer, tmp_path: Path, how: str
) -> None:
    """A partial load whose caller changed its tensors at once leaves their changed bytes in
    the partial entry (written after hand-out, with the digest they arrived with); the
    next loads resume that entry and must get the server's bytes, not the caller's."""
    path = write_file(http_server.root / "m.safetensors", twelve())
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    names = sorted(twelve())[:8]
    async with Loader(cache_dir=root, chunk_size="64KiB", concurrency=1) as loader:
        if how == "subset":
            got = await loader.load(url, tensors=names)
            for tensor in got.values():
                flip(tensor)
        else:
            # Slow reads: the stream is left while the load is still reading.
            http_server.stall("m.safetensors", 0.05, count=10_000, before_headers=True)
            async with loader.stream(url) as stream:
                seen = 0
                async for _, tensor in stream:
                    flip(tensor)
                    seen += 1
                    if seen == 5:
                        break
            http_server.clear_faults()
    await ModelCache(root).wait_committed()
    # The changed bytes did reach the partial entry, with their digests on arrival.
    assert digest_lines(root, url)

    # The same reads as before: each range written then is one these loads ask for.
    same = {"chunk_size": "64KiB", "concurrency": 1}
    subset = await load_model(url, cache_dir=root, tensors=names, **same)
    assert_same(subset, {n: t for n, t in load_file(str(path)).items() if n in names})
    # Its writes run after it returns, holding the entry: the next load waits for them.
    assert_matches_files(await load_model(url, cache_dir=root, **same), path)
    await ModelCache(root).wait_committed()
    assert [r.status for r in await ModelCache(root).verify(url)] == ["ok"]
    assert_matches_files(await load_model(url, cache_dir=root), path)


_CHANGE_AND_DIE = """
import asyncio, os, signal, sys, time, torch
from pathlib import Path
from aioloader import Loader
from aioloader.cache.entry import key_of

async def main():
    root, url = sys.argv[1], sys.argv[2]
    journal = Path(root) / "entries" / key_of(url) / "data.ranges"
    async with Loader(cache_dir=root, chunk_size="1MiB", concurrency=2) as loader:
        async with loader.stream(url) as stream:
            async for _, tensor in stream:  # changed as it arrives, before it is written
                tensor.view(-1).view(torch.uint8).bitwise_not_()
    # Killed once the first changed range is on disk, during the writes after the load
    # (or when the commit has already dropped the entry).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if any(len(x.split()) == 3 for x in journal.read_text().splitlines()):
                break
        except OSError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


async def test_a_process_killed_after_changing_its_tensors_leaves_nothing_wrong(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", twelve(1))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    for _ in range(2):
        # Slow reads, so that each tensor is changed before the load ends and writes it.
        http_server.stall("m.safetensors", 0.05, count=10_000, before_headers=True)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CHANGE_AND_DIE, str(root), url
        )
        assert await proc.wait() == -signal.SIGKILL
        http_server.clear_faults()
        # The same reads as the dead process: each range it wrote is one this load asks for.
        got = await load_model(url, cache_dir=root, chunk_size="1MiB", concurrency=2)
        assert_matches_files(got, path)
        await ModelCache(root).wait_committed()
    assert_matches_files(await load_model(url, cache_dir=root), path)


async def test_a_file_of_many_small_tensors_is_cached_whole(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """Over 1024 tensors in one file: the plan cuts spans that share a 4 KiB block, so
    the writes after the load overlap; each must still be checked and the entry kept."""
    tensors = {f"t.{i:05d}": torch.full((37,), float(i)) for i in range(3000)}
    path = write_file(http_server.root / "m.safetensors", tensors)
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    assert_matches_files(await load_model(url, cache_dir=root), path)
    await ModelCache(root).wait_committed()
    assert [r.status for r in await ModelCache(root).verify(url)] == ["ok"]
    http_server.reset_counters()
    assert_matches_files(await load_model(url, cache_dir=root), path)
    assert len(http_server.gets()) == 1  # the probe: the bytes came from the cache


# -- 2. waits that could close a cycle -------------------------------------------------


async def test_two_loads_wanting_each_others_entries_both_finish(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """[f1, f2] and [f2, f1] at once, in two processes: each used to hold one entry for its
    whole load and wait forever for the other's."""
    folder = http_server.root / "m"
    write_sharded(folder, twelve(2), shards=2)
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    urls = [http_server.url_for(f"m/{name}") for name in files]
    root = tmp_path / "cache"
    http_server.stall(None, 0.2, count=8, before_headers=True)  # uneven store latency
    code = (
        "import asyncio, sys; from aioloader import load_model; "
        "asyncio.run(load_model(sys.argv[2:], cache_dir=sys.argv[1]))"
    )
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(root), *order)
        for order in (urls, urls[::-1])
    ]
    try:
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 60)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert codes == [0, 0]
    got = await load_model(urls, cache_dir=root)
    assert_matches_files(got, *(folder / name for name in files))


async def test_two_loaders_in_one_process_in_opposite_order(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    folder = http_server.root / "m"
    write_sharded(folder, twelve(3), shards=2)
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    urls = [http_server.url_for(f"m/{name}") for name in files]
    root = tmp_path / "cache"
    http_server.stall(None, 0.1, count=8, before_headers=True)
    one, other = await asyncio.wait_for(
        asyncio.gather(load_model(urls, cache_dir=root), load_model(urls[::-1], cache_dir=root)),
        60,
    )
    paths = [folder / name for name in files]
    assert_matches_files(one, *paths)
    assert_matches_files(other, *paths)


async def test_the_same_url_twice_does_not_wait_for_itself(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", twelve(4))
    url = http_server.url_for("m.safetensors")
    try:
        got = await asyncio.wait_for(load_model([url, url], cache_dir=tmp_path / "c"), 30)
    except CacheError:
        raise
    except ValueError as exc:  # a model that names each tensor twice may be refused, named
        assert "m.safetensors" in str(exc)
    else:
        assert_matches_files(got, path)


async def test_a_forked_child_does_not_keep_the_entry_locked(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """A worker pool forked during a load inherits the entry lock's descriptor; the lock
    must still be free once the load lets go, while the child lives on."""
    write_file(http_server.root / "m.safetensors", twelve(5))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    lock = entry_dir(root, url) / "lock"
    child = 0
    async with Loader(cache_dir=root) as loader:
        async with loader.stream(url) as stream:
            async for _ in stream:
                assert held_by_other(lock)  # this load holds it
                child = os.fork()
                if child == 0:
                    time.sleep(30)  # noqa: ASYNC251 (the forked child, not the loop)
                    os._exit(0)
                break
    try:
        await ModelCache(root).wait_committed()
        assert not held_by_other(lock)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)  # noqa: ASYNC222 (it is dead)


async def test_a_fetch_gives_up_on_a_holder_that_makes_no_progress(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    write_file(http_server.root / "m.safetensors", twelve(6))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    entry_dir(root, url).mkdir(parents=True)
    held = try_acquire(entry_dir(root, url) / "lock", exclusive=True)  # and never touched
    assert held is not None
    try:
        cache = ModelCache(root, lock_stall=0.5)
        with pytest.raises(CacheError) as info:
            await asyncio.wait_for(cache.fetch(url), 30)
        assert url in str(info.value) and "no progress" in str(info.value)
    finally:
        held.release()
    assert (await ModelCache(root).fetch(url)).downloaded > 0


async def test_a_load_reads_uncached_while_another_load_holds_the_entry(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", twelve(7))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    entry_dir(root, url).mkdir(parents=True)
    held = try_acquire(entry_dir(root, url) / "lock", exclusive=True)
    assert held is not None
    try:
        got = await asyncio.wait_for(load_model(url, cache_dir=root), 30)
        assert_matches_files(got, path)
        assert not (entry_dir(root, url) / "meta.json").exists()  # it left the entry alone
        # A stalled writer (a fetch, marked as one) is waited for only as long as it allows.
        mark = try_acquire(entry_dir(root, url) / "writer", exclusive=True)
        assert mark is not None
        try:
            cache = ModelCache(root, lock_stall=0.5)
            assert_matches_files(await asyncio.wait_for(load_model(url, cache_dir=cache), 30), path)
        finally:
            mark.release()
    finally:
        held.release()


# -- 10. secrets at rest ---------------------------------------------------------------


def _signed(url: str, signature: str) -> str:
    return (
        f"{url}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20260101"
        f"&X-Amz-Expires=600&X-Amz-Signature={signature}"
    )


async def test_a_signed_url_is_cached_by_its_object_and_never_stored(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    path = write_file(http_server.root / "m.safetensors", twelve(8))
    plain = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    first, second = _signed(plain, "a" * 64), _signed(plain, "b" * 64)
    assert key_of(first) == key_of(second) == key_of(plain)

    assert (await ModelCache(root).fetch(first)).downloaded > 0
    again = await ModelCache(root).fetch(second)  # signed again: the same object
    assert again.hit and again.downloaded == 0
    assert_matches_files(await load_model(second, cache_dir=root), path)
    [entry] = ModelCache(root).entries()
    assert "a" * 64 not in entry.url and "AKIDEXAMPLE" not in entry.url
    for file in root.rglob("*"):
        if file.is_file() and not file.is_symlink():
            text = file.read_bytes()
            assert b"a" * 64 not in text and b"AKIDEXAMPLE" not in text, file
            assert stat.S_IMODE(file.stat().st_mode) & 0o007 == 0, file  # not the world's
    for folder in [root / "entries", entry_dir(root, plain)]:
        assert stat.S_IMODE(folder.stat().st_mode) & 0o007 == 0

    [result] = await ModelCache(root).verify()
    assert result.status == "ok" and "a" * 64 not in result.detail
    [result] = await ModelCache(root).verify(second)
    assert result.status == "ok" and "b" * 64 not in result.url + result.detail

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioloader", "cache", "verify", "--cache-dir", str(root), first,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out
    assert b"ok" in out and b"a" * 64 not in out and b"AKIDEXAMPLE" not in out


# -- wrong values ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", b"/tmp/x", 3])
async def test_a_cache_folder_that_is_no_folder_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="cache"):
        ModelCache(value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cache"):
        async with Loader(cache_dir=value):  # type: ignore[arg-type]
            pass


async def test_an_empty_cache_variable_means_no_cache(
    http_server: FaultyHttpServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_file(http_server.root / "m.safetensors", twelve(9))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("AIOLOADER_CACHE_DIR", "")
    assert_matches_files(await load_model(http_server.url_for("m.safetensors")), path)
    assert list(work.iterdir()) == []  # nothing written into the working directory


@pytest.mark.parametrize(
    "options",
    [
        {"lock_stall": float("nan")},
        {"lock_stall": float("inf")},
        {"lock_stall": 0},
        {"lock_stall": -1},
        {"lock_stall": True},
        {"lock_stall": "5"},
        {"max_bytes": -1},
        {"max_bytes": 1.5},
        {"max_bytes": True},
    ],
)
def test_wrong_cache_options_are_refused(tmp_path: Path, options: dict[str, object]) -> None:
    name = next(iter(options))
    with pytest.raises(ConfigError, match=name):
        ModelCache(tmp_path, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["maybe", "2", "ja"])
def test_a_wrong_etag_switch_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("AIOLOADER_CHECK_ETAG", value)
    with pytest.raises(ConfigError, match="AIOLOADER_CHECK_ETAG"):
        ModelCache(tmp_path)


async def test_a_store_whose_etags_only_look_like_md5s_can_be_fetched(
    s3_env: MotoS3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon, Ray and vLLM make their own ModelCache: the switch is the environment.
    (An S3-compatible store's: no other server's ETag is taken for an MD5.)"""
    from .test_cache_verify import s3_objects

    path = write_file(tmp_path / "m.safetensors", twelve(10))
    etag = "0123456789abcdef0123456789abcdef"
    url = s3_objects(s3_env, {"m": path}, {"m": etag})["m"]
    with pytest.raises(CacheError, match="AIOLOADER_CHECK_ETAG=0"):
        await ModelCache(tmp_path / "a").fetch(url)
    monkeypatch.setenv("AIOLOADER_CHECK_ETAG", "0")
    model = await ModelCache(tmp_path / "b").fetch(url)
    assert_matches_files(await load_model(str(model.path)), path)
