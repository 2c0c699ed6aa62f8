"""A commit's listing: kept in the hub cache (``trees/<commit>.json``), read back so a
warm load asks the Hub as little as it can, and checked wherever it comes from.

huggingface_hub's ``snapshot_download`` writes the same file; a cache it filled is
read with its listing, and a listing that is damaged or lies is never trusted."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioloader import AccessDeniedError, Loader, SourceError, load_model
from aioloader.sinks.hf.cache_writes import wait_hf_cache
from aioloader.sources.hf.snapshot import Snapshot
from aioloader.sources.hf.tree import TreeEntry, bad_path, dump_tree, parse_tree

from . import test_hf
from .helpers import assert_matches_files, some_big, write_sharded
from .hub_server import LocalHub

hub = test_hf.hub  # the local Hub fixture; its hub cache is tmp_path / "hf-cache"
hf = pytest.importorskip("huggingface_hub")

REPO = "org/model"
SHA1 = "a" * 40
SHA256 = "b" * 64


def _repo(tmp_path: Path, hub: LocalHub) -> tuple[str, list[Path]]:
    folder = tmp_path / "src"
    write_sharded(folder, some_big(1), shards=2)
    (folder / "config.json").write_text('{"model_type": "test"}')
    return hub.commit(REPO, test_hf._files(folder)), sorted(folder.glob("*.safetensors"))


def _memo(tmp_path: Path, sha: str) -> Path:
    return tmp_path / "hf-cache" / "models--org--model" / "trees" / f"{sha}.json"


# -- the file's format (pure) ------------------------------------------------------------


def test_a_listing_survives_its_file() -> None:
    tree = {
        "config.json": TreeEntry(12, SHA1),
        "sub/model.safetensors": TreeEntry(1 << 40, SHA1, SHA256, "c" * 64),
    }
    assert parse_tree(dump_tree(tree)) == tree
    document = json.loads(dump_tree(tree))
    assert document["format_version"] == 1
    assert document["files"]["sub/model.safetensors"]["lfs_size"] == 1 << 40


def _document(files: object, version: object = 1) -> bytes:
    return json.dumps({"format_version": version, "files": files}).encode()


def _one(**info: object) -> bytes:
    return _document({"a": {"size": 1, "blob_id": SHA1} | info})


@pytest.mark.parametrize(
    "document",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"format_version": 1}',
        _document({"a": {"size": 1, "blob_id": SHA1}}, version=2),
        _document({"a": {"size": 1, "blob_id": SHA1}}, version="1"),
        _document({}),
        _document([]),
        _document({"a": []}),
        _one(size=-1),
        _one(size=True),
        _one(size=1.5),
        _one(size="1"),
        _one(blob_id="../../etc/passwd"),
        _one(blob_id=SHA1.upper()),
        _one(blob_id=None),
        _one(lfs_sha256="../x"),
        _one(lfs_sha256=SHA256, lfs_size=2),
        _one(xet_hash=7),
        _document({"../escape": {"size": 1, "blob_id": SHA1}}),
        _document({"/abs": {"size": 1, "blob_id": SHA1}}),
    ],
)
def test_a_file_that_is_not_a_listing_is_ignored(document: bytes) -> None:
    assert parse_tree(document) is None


@pytest.mark.parametrize(
    "path",
    ["", "/etc/passwd", "..", "../x", "a/../../x", "a//b", "a/./b", "a/", "a\\b", "a\x00b",
     "a\nb", "x" * 5000, None, 3, b"model.safetensors"],
)  # fmt: skip
def test_a_path_outside_the_snapshot_is_refused(path: object) -> None:
    assert bad_path(path) is not None


@pytest.mark.parametrize("path", ["model.safetensors", "a/b/c.json", "é/ü.txt", ".gitattributes"])
def test_an_ordinary_path_is_accepted(path: str) -> None:
    assert bad_path(path) is None


def test_an_odd_name_stays_listed_and_out_of_the_files() -> None:
    tree = parse_tree(
        _document({"back\\slash.txt": {"size": 1, "blob_id": SHA1},
                   "tab\there.txt": {"size": 2, "blob_id": SHA1},
                   "m.safetensors": {"size": 3, "blob_id": SHA1, "lfs_sha256": SHA256}})
    )  # fmt: skip
    assert tree is not None and len(tree) == 3, "the listing is kept whole"
    snapshot = Snapshot.of_tree(REPO, "main", SHA1, tree)
    assert snapshot.files == {"m.safetensors": 3}
    assert snapshot.left_out == ["back\\slash.txt", "tab\there.txt"]
    assert snapshot.names_in("") == ["m.safetensors"]


# -- against the Hub -------------------------------------------------------------------------


async def test_a_cached_listing_spares_the_hub(hub: LocalHub, tmp_path: Path) -> None:
    sha, shards = _repo(tmp_path, hub)
    # huggingface_hub fills the cache, its listing of the commit with it.
    hf.snapshot_download(REPO, cache_dir=tmp_path / "hf-cache", endpoint=hub.url, token=False)
    assert _memo(tmp_path, sha).is_file()
    before_hub, before_storage = len(hub.log), len(hub.storage.requests)

    assert_matches_files(await load_model(f"hf://{REPO}@{sha}"), *shards)
    assert len(hub.log) == before_hub, "a commit whose listing is cached asks the Hub nothing"

    assert_matches_files(await load_model(f"hf://{REPO}"), *shards)
    assert [r.path for r in hub.log[before_hub:]] == [f"/api/models/{REPO}/revision/main"], (
        "a branch asks only which commit it points to"
    )
    assert len(hub.storage.requests) == before_storage


@pytest.mark.parametrize(
    "damage",
    [
        b"{",
        b'{"format_version": 9, "files": {}}',
        b'{"format_version": 1, "files": {"../../../escape.safetensors": '
        b'{"size": 1, "blob_id": "' + SHA1.encode() + b'"}}}',
    ],
)
async def test_a_damaged_listing_is_not_trusted(
    hub: LocalHub, tmp_path: Path, damage: bytes
) -> None:
    sha, shards = _repo(tmp_path, hub)
    hf.snapshot_download(REPO, cache_dir=tmp_path / "hf-cache", endpoint=hub.url, token=False)
    _memo(tmp_path, sha).write_bytes(damage)
    before = len(hub.log)
    got = await load_model(f"hf://{REPO}@{sha}")
    assert_matches_files(got, *shards)
    assert any("/tree/" in r.path for r in hub.log[before:]), "the Hub was asked"
    assert not list(tmp_path.rglob("escape*"))


@pytest.mark.parametrize("path", ["../escape.json", "a/../../escape.json", "sub//x.json"])
async def test_a_hub_that_lists_a_path_outside_the_snapshot_is_refused(
    hub: LocalHub, tmp_path: Path, path: str
) -> None:
    folder = tmp_path / "src"
    write_sharded(folder, some_big(1), shards=1)
    files = test_hf._files(folder)
    files[path] = b"{}"
    hub.commit(REPO, files)
    with pytest.raises(SourceError, match=r"listed a file .*(escape|x)\.json") as info:
        await load_model(f"hf://{REPO}")
    assert REPO in str(info.value) and "HF_ENDPOINT" in str(info.value)
    assert not list(tmp_path.rglob("escape*"))


async def test_an_odd_name_elsewhere_in_the_repository_does_not_fail_the_load(
    hub: LocalHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "src"
    write_sharded(folder, some_big(1), shards=2)
    files = test_hf._files(folder) | {"back\\slash.txt": b"odd", "docs/tab\tname.md": b"odd"}
    sha = hub.commit(REPO, files)
    shards = sorted(folder.glob("*.safetensors"))
    with caplog.at_level(logging.WARNING):
        assert_matches_files(await load_model(f"hf://{REPO}"), *shards)
        await wait_hf_cache()
    (warning,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "'back\\\\slash.txt'" in warning and sha[:12] in warning
    assert "back\\slash.txt" in json.loads(_memo(tmp_path, sha).read_bytes())["files"]
    # A cache huggingface_hub filled, the odd files with it, is read without the Hub.
    other = tmp_path / "hf-cache"
    hf.snapshot_download(REPO, cache_dir=other, endpoint=hub.url, token=False)
    assert (other / "models--org--model" / "snapshots" / sha / "back\\slash.txt").is_file()
    before = len(hub.log)
    assert_matches_files(await load_model(f"hf://{REPO}@{sha}"), *shards)
    assert len(hub.log) == before


# -- the warm start of a branch (warm_start.py) ------------------------------------------------


def _commit(tmp_path: Path, hub: LocalHub, seed: int) -> tuple[str, list[Path]]:
    folder = tmp_path / f"src-{seed}"
    write_sharded(folder, some_big(seed), shards=2)
    (folder / "config.json").write_text('{"model_type": "test"}')
    return hub.commit(REPO, test_hf._files(folder)), sorted(folder.glob("*.safetensors"))


def _snapshot_download(hub: LocalHub, tmp_path: Path) -> None:
    hf.snapshot_download(REPO, cache_dir=tmp_path / "hf-cache", endpoint=hub.url, token=False)


async def test_a_warm_branch_is_read_from_the_cache_and_confirmed(
    hub: LocalHub, tmp_path: Path
) -> None:
    _, shards = _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    before, stored = len(hub.log), len(hub.storage.requests)
    async with Loader() as loader:
        assert_matches_files(await loader.load(f"hf://{REPO}"), *shards)
        assert_matches_files(await loader.load(f"hf://{REPO}@main"), *shards)
    assert [r.path for r in hub.log[before:]] == [f"/api/models/{REPO}/revision/main"] * 2
    assert len(hub.storage.requests) == stored


async def test_a_branch_that_moved_since_the_cache_loads_its_new_commit(
    hub: LocalHub, tmp_path: Path
) -> None:
    first, _ = _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    second, shards = _commit(tmp_path, hub, 2)
    got = await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    assert_matches_files(got, *shards)
    ours = tmp_path / "hf-cache" / "models--org--model"
    assert (ours / "refs" / "main").read_text() == second, "the new ref is recorded"
    # Moved again right after the Hub answers: the load is the commit it answered.
    third, _ = _commit(tmp_path, hub, 3)
    hub.tag(REPO, "main", second)
    hub.move_after_first(REPO, "main", third)
    got = await load_model(f"hf://{REPO}")
    assert_matches_files(got, *shards)
    assert first != second != third


async def test_the_hubs_refusal_is_the_loads_error_even_when_cached(
    hub: LocalHub, tmp_path: Path
) -> None:
    _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    hub.private(REPO, {"hf_secret"})
    with pytest.raises(AccessDeniedError, match=f"{REPO}.*huggingface-cli login"):
        await load_model(f"hf://{REPO}")


async def test_a_stream_asks_the_hub_before_it_reads_the_cache(
    hub: LocalHub, tmp_path: Path
) -> None:
    _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    _, shards = _commit(tmp_path, hub, 2)
    got = {}
    async with Loader() as loader, loader.stream(f"hf://{REPO}") as stream:
        async for name, tensor in stream:
            got[name] = tensor
    assert_matches_files(got, *shards)


async def test_a_warm_load_returns_only_once_the_hub_has_answered(
    hub: LocalHub, tmp_path: Path
) -> None:
    _, shards = _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    hub.api_delay = 1.5
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await load_model(f"hf://{REPO}")
    assert loop.time() - started >= 1.5
    assert_matches_files(got, *shards)


async def test_a_warm_load_cancelled_while_the_hub_is_asked_leaves_nothing(
    hub: LocalHub, tmp_path: Path
) -> None:
    _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    hub.api_delay = 1.0
    async with Loader() as loader:
        task = asyncio.create_task(loader.load(f"hf://{REPO}"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        hub.api_delay = 0.0
        assert await loader.load(f"hf://{REPO}"), "the Loader is still usable"


async def test_a_warm_load_of_a_private_branch_asks_with_the_token(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, shards = _commit(tmp_path, hub, 1)
    hub.private(REPO, {"hf_secret"})
    hf.snapshot_download(REPO, cache_dir=tmp_path / "hf-cache", endpoint=hub.url, token="hf_secret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    before, stored = len(hub.log), len(hub.storage.requests)
    assert_matches_files(await load_model(f"hf://{REPO}"), *shards)
    asked = hub.log[before:]
    assert [r.path for r in asked] == [f"/api/models/{REPO}/revision/main"]
    assert asked[0].headers.get("Authorization") == "Bearer hf_secret"
    assert len(hub.storage.requests) == stored


async def test_two_loads_of_a_moving_branch_in_one_loader_each_get_one_commit(
    hub: LocalHub, tmp_path: Path
) -> None:
    first, first_shards = _commit(tmp_path, hub, 1)
    second, second_shards = _commit(tmp_path, hub, 2)
    hub.tag(REPO, "main", first)
    hub.move_after_first(REPO, "main", second)
    # The first load is still reading its index when the second resolves the branch.
    hub.delays["model.safetensors.index.json"] = 1.0

    async def later(loader: Loader) -> dict[str, object]:
        await asyncio.sleep(0.3)
        return await loader.load(f"hf://{REPO}")

    async with Loader(hf_cache=False) as loader:
        one, two = await asyncio.gather(loader.load(f"hf://{REPO}"), later(loader))
    assert_matches_files(one, *first_shards)
    assert_matches_files(two, *second_shards)


@pytest.mark.parametrize("lie", ["", "main", "z" * 40, "A" * 40, 7, None, ["a" * 40]])
async def test_a_hub_that_answers_no_commit_fails_the_warm_load_by_name(
    hub: LocalHub, tmp_path: Path, lie: object
) -> None:
    _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    hub.lying_sha = lie if lie is not None else "missing"
    with pytest.raises(SourceError, match=f"{REPO}@main") as info:
        await load_model(f"hf://{REPO}")
    assert "HF_ENDPOINT" in str(info.value) or "try again" in str(info.value)


_TWO = """
import asyncio, sys, torch
from aioloader import load_model
got = asyncio.run(load_model(sys.argv[1]))
print(sum(int(t.view(torch.uint8).sum()) for t in got.values()))
"""


def test_two_processes_start_warm_at_once(hub: LocalHub, tmp_path: Path) -> None:
    _, shards = _commit(tmp_path, hub, 1)
    _snapshot_download(hub, tmp_path)
    from safetensors.torch import load_file

    expected = sum(int(t.view(torch.uint8).sum()) for s in shards for t in load_file(s).values())
    children = [
        subprocess.Popen([sys.executable, "-c", _TWO, f"hf://{REPO}"], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        assert int(out) == expected
