"""The Hugging Face hub cache, written by hf:// loads and read by them.

The oracle is huggingface_hub itself: it downloads the same repository from the
same local Hub (tests/hub_server.py) into another cache, and the two trees must
match file for file; its offline readers and its checksum verification must
accept ours. Every tensor is compared bit for bit with safetensors.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aioloader import DigestMismatchError, Loader, NotFoundError, load_model
from aioloader.sinks import commits
from aioloader.sinks.hf.cache_writes import wait_hf_cache

from . import test_hf
from .helpers import assert_matches_files, some_big, write_file, write_sharded
from .hub_server import LocalHub
from .loop_clock import loop_clock

hub = test_hf.hub  # the local Hub fixture; its hub cache is tmp_path / "hf-cache"
_files = test_hf._files

hf = pytest.importorskip("huggingface_hub")

REPO = "org/model"
SMALL = {
    "config.json": b'{"model_type": "test"}',
    "tokenizer.json": b'{"version": "1.0"}',
    "generation_config.json": b'{"do_sample": false}',
    "sub/notes.txt": b"a file in a folder",
}


def _repo(tmp_path: Path, hub: LocalHub, seed: int = 1, repo: str = REPO) -> tuple[str, Path]:
    folder = tmp_path / f"src-{repo.replace('/', '-')}-{seed}"
    write_sharded(folder, some_big(seed), shards=3)
    for name, data in SMALL.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return hub.commit(repo, _files(folder)), folder


def _tree(root: Path, repo: str = REPO) -> dict[str, tuple[str, bytes]]:
    """Every entry of a repository's cache folder: symlinks by target, files by bytes
    (``trees/<commit>.json``, the commit's listing, included)."""
    top = root / ("models--" + repo.replace("/", "--"))
    out = {}
    for path in sorted(top.rglob("*")):
        name = path.relative_to(top).as_posix()
        if path.is_symlink():
            out[name] = ("link", os.readlink(path).encode())
        elif path.is_file():
            out[name] = ("file", path.read_bytes())
    return out


def _oracle(hub: LocalHub, tmp_path: Path, revision: str = "main") -> Path:
    root = tmp_path / "oracle"
    hf.snapshot_download(REPO, revision=revision, cache_dir=root, endpoint=hub.url, token=False)
    return root


async def test_the_cache_is_the_one_huggingface_hub_writes(hub: LocalHub, tmp_path: Path) -> None:
    sha, folder = _repo(tmp_path, hub)
    ours = tmp_path / "hf-cache"
    got = await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    shards = sorted(folder.glob("*.safetensors"))
    assert_matches_files(got, *shards)
    assert _tree(ours) == _tree(_oracle(hub, tmp_path))
    assert (ours / "models--org--model" / "refs" / "main").read_text() == sha
    assert not list(ours.rglob("*.tmp")), "no temporary file is left"
    # huggingface_hub's offline readers accept what we wrote.
    assert_huggingface_hub_accepts(hub, ours, sha, folder)


def assert_huggingface_hub_accepts(hub: LocalHub, ours: Path, sha: str, folder: Path) -> None:
    """huggingface_hub's offline readers and its checksum check accept the cache ``ours``
    holding ``folder``'s files at ``sha``, every tensor bit for bit."""
    snapshot = Path(hf.snapshot_download(REPO, cache_dir=ours, local_files_only=True))
    assert snapshot.name == sha
    for shard in sorted(folder.glob("*.safetensors")):
        path = hf.hf_hub_download(REPO, shard.name, cache_dir=ours, local_files_only=True)
        assert_matches_files(load_file(path), shard)
    config = hf.hf_hub_download(REPO, "config.json", cache_dir=ours, local_files_only=True)
    assert json.loads(Path(config).read_text()) == {"model_type": "test"}
    verification = hf.HfApi(endpoint=hub.url, token=False).verify_repo_checksums(
        REPO, cache_dir=ours
    )
    assert not verification.mismatches and not verification.missing_paths
    assert verification.checked_count == len(_files(folder))


async def test_a_second_load_reads_the_cache_not_the_storage_host(
    hub: LocalHub, tmp_path: Path
) -> None:
    _, folder = _repo(tmp_path, hub)
    await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    before = len(hub.storage.requests)
    got = await load_model(f"hf://{REPO}")
    assert_matches_files(got, *sorted(folder.glob("*.safetensors")))
    assert len(hub.storage.requests) == before


async def test_a_cache_filled_by_huggingface_hub_is_read(hub: LocalHub, tmp_path: Path) -> None:
    _, folder = _repo(tmp_path, hub)
    hf.snapshot_download(REPO, cache_dir=tmp_path / "hf-cache", endpoint=hub.url, token=False)
    before = len(hub.storage.requests)
    got = await load_model(f"hf://{REPO}")
    assert_matches_files(got, *sorted(folder.glob("*.safetensors")))
    assert len(hub.storage.requests) == before


async def test_a_corrupted_blob_is_never_committed(hub: LocalHub, tmp_path: Path) -> None:
    _, folder = _repo(tmp_path, hub)
    shard = sorted(folder.glob("*.safetensors"))[0]
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    stored = tmp_path / "hub-storage" / digest
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF  # the last tensor's last byte: the header still parses
    stored.write_bytes(bytes(data))
    # The load refuses the file (test_digest.py); its cache write refuses it too.
    with pytest.raises(DigestMismatchError, match=shard.name):
        await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    cache = tmp_path / "hf-cache" / "models--org--model"
    assert not (cache / "blobs" / digest).exists()
    assert not list(cache.glob(f"snapshots/*/{shard.name}"))
    assert not list(cache.rglob("*.tmp"))


async def test_a_tensor_changed_before_the_write_never_reaches_the_cache(
    hub: LocalHub, tmp_path: Path
) -> None:
    folder = tmp_path / "one"
    tensors = {"w": torch.arange(1 << 20, dtype=torch.float32)}  # past the header's probe
    write_file(folder / "model.safetensors", tensors)
    hub.commit(REPO, _files(folder))
    # Hold both commit threads, so the write surely runs after the change below.
    gate = threading.Event()
    started = [threading.Event() for _ in range(2)]
    other = tmp_path / "elsewhere"
    for event in started:
        commits.submit(other, lambda e=event: (e.set(), gate.wait(30)))  # type: ignore[misc]
    for event in started:
        event.wait(10)
    got = await load_model(f"hf://{REPO}")
    got["w"][-1] = 12345.0  # past the header's probe, whose bytes are kept as read
    gate.set()
    await commits.wait(other)
    await wait_hf_cache()
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert not (tmp_path / "hf-cache" / "models--org--model" / "blobs" / digest).exists()


async def test_a_branch_moved_mid_load_caches_one_commit(hub: LocalHub, tmp_path: Path) -> None:
    first, folder = _repo(tmp_path, hub, seed=1)
    second, _ = _repo(tmp_path, hub, seed=2)
    hub.tag(REPO, "main", first)
    hub.move_after_first(REPO, "main", second)
    got = await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    assert_matches_files(got, *sorted(folder.glob("*.safetensors")))
    ours = tmp_path / "hf-cache" / "models--org--model"
    assert (ours / "refs" / "main").read_text() == first
    assert [p.name for p in (ours / "snapshots").iterdir()] == [first]
    for shard in sorted(folder.glob("*.safetensors")):
        assert (ours / "snapshots" / first / shard.name).read_bytes() == shard.read_bytes()


async def test_a_partial_load_writes_no_file_it_did_not_read_whole(
    hub: LocalHub, tmp_path: Path
) -> None:
    _repo(tmp_path, hub)
    await load_model(f"hf://{REPO}", tensors=["big.0"])
    await wait_hf_cache()
    ours = tmp_path / "hf-cache" / "models--org--model"
    cached = {p.name for p in ours.glob("snapshots/*/*.safetensors")}
    assert cached == set()  # big.0's shard holds other tensors too
    assert (ours / "refs" / "main").is_file()
    assert not list(ours.rglob("*.tmp"))


async def test_hf_cache_false_writes_nothing(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, folder = _repo(tmp_path, hub)
    assert_matches_files(
        await load_model(f"hf://{REPO}", hf_cache=False), *sorted(folder.glob("*.safetensors"))
    )
    monkeypatch.setenv("AIOLOADER_HF_CACHE", "0")
    await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    assert not (tmp_path / "hf-cache").exists()


async def test_offline_loads_from_the_cache_without_a_request(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha, folder = _repo(tmp_path, hub)
    await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    hub_before, storage_before = len(hub.log), len(hub.storage.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shards = sorted(folder.glob("*.safetensors"))
    assert_matches_files(await load_model(f"hf://{REPO}"), *shards)
    assert_matches_files(await load_model(f"hf://{REPO}@{sha}"), *shards)
    assert len(hub.log) == hub_before and len(hub.storage.requests) == storage_before
    with pytest.raises(NotFoundError, match=r"HF_HUB_OFFLINE is set.*no ref 'v2'"):
        await load_model(f"hf://{REPO}@v2")
    with pytest.raises(NotFoundError, match=r"HF_HUB_OFFLINE is set.*org/other"):
        await load_model("hf://org/other")
    link = tmp_path / "hf-cache" / "models--org--model" / "snapshots" / sha / shards[1].name
    (link.parent / os.readlink(link)).unlink()
    with pytest.raises(NotFoundError, match=shards[1].name) as missing:
        await load_model(f"hf://{REPO}")
    cause = str(missing.value.__cause__)
    assert f"Hugging Face cache at {tmp_path / 'hf-cache'} lacks '{shards[1].name}'" in cause
    assert len(hub.log) == hub_before and len(hub.storage.requests) == storage_before


async def test_the_loop_is_not_blocked_while_the_cache_is_written(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the load nor the cache writes after it hold the loop: no callback computes
    for long (CPU time, which a busy machine does not stretch), and no wait of a whole
    file's writing happens on it (the wall clock, with room for the scheduling of two
    CPUs that the Hub, its storage host and the loader share)."""
    folder = tmp_path / "large"
    write_file(folder / "model.safetensors", {f"w{i}": torch.randn(1 << 20) for i in range(24)})
    hub.commit(REPO, _files(folder))
    worst, done = 0.0, asyncio.Event()

    async def probe() -> None:
        nonlocal worst
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    gc.collect()
    with loop_clock(monkeypatch) as clock:
        task = asyncio.create_task(probe())
        async with Loader() as loader:
            got = await loader.load(f"hf://{REPO}")
        await wait_hf_cache()
        done.set()
        await task
    assert_matches_files(got, folder / "model.safetensors")
    assert clock.worst < 0.1, clock.describe()
    assert worst < 1.0, f"the event loop stalled {worst * 1000:.0f} ms"


_CHILD = """
import asyncio, sys
from aioloader import load_model
from aioloader.sinks.hf.cache_writes import wait_hf_cache

async def main():
    await load_model(sys.argv[1])
    print("loaded", flush=True)
    if sys.argv[2] == "wait":
        await wait_hf_cache()
    else:
        await asyncio.sleep(60)

asyncio.run(main())
"""


def _child(url: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, mode], stdout=subprocess.PIPE, text=True
    )


def _assert_every_blob_whole(root: Path) -> None:
    for blob in (root / "models--org--model" / "blobs").iterdir():
        if blob.name.endswith(".tmp"):
            continue
        data = blob.read_bytes()
        assert blob.name in (
            hashlib.sha256(data).hexdigest(),
            hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
        ), f"{blob.name} holds other bytes"


def test_kill_9_during_the_write_leaves_no_half_blob(hub: LocalHub, tmp_path: Path) -> None:
    folder = tmp_path / "large"
    write_file(folder / "model.safetensors", {f"w{i}": torch.randn(1 << 20) for i in range(48)})
    hub.commit(REPO, _files(folder))
    child = _child(f"hf://{REPO}", "sleep")
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "loaded"
    # Killed once the writer has begun (its temporary file is there), not before.
    blobs = tmp_path / "hf-cache" / "models--org--model" / "blobs"
    deadline = time.monotonic() + 60
    while not (blobs.is_dir() and any(blobs.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    child.stdout.close()
    _assert_every_blob_whole(tmp_path / "hf-cache")
    # The next load finishes the job.
    got = asyncio.run(_load_and_wait(f"hf://{REPO}"))
    assert_matches_files(got, folder / "model.safetensors")
    assert _tree(tmp_path / "hf-cache") == _tree(_oracle(hub, tmp_path))


async def _load_and_wait(url: str) -> dict[str, torch.Tensor]:
    got = await load_model(url)
    await wait_hf_cache()
    return got


def test_two_processes_fill_one_cache(hub: LocalHub, tmp_path: Path) -> None:
    _repo(tmp_path, hub)
    children = [_child(f"hf://{REPO}", "wait") for _ in range(2)]
    for child in children:
        assert child.wait(120) == 0
        assert child.stdout is not None
        child.stdout.close()
    _assert_every_blob_whole(tmp_path / "hf-cache")
    assert _tree(tmp_path / "hf-cache") == _tree(_oracle(hub, tmp_path))
    assert not list((tmp_path / "hf-cache").rglob("*.tmp"))
