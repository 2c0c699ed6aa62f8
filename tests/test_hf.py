"""``hf://`` against a local Hub (tests/hub_server.py) with its storage host beside it.

HF_ENDPOINT points huggingface_hub and the source at the local Hub, HF_TOKEN gives
the token; every tensor is compared bit for bit with safetensors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aioloader import (
    AccessDeniedError,
    Loader,
    NotFoundError,
    ReadError,
    SourceError,
    inspect_model,
    load_model,
)
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import (
    assert_matches_files,
    assert_same,
    random_tensors,
    some_big,
    write_file,
    write_sharded,
)
from .hub_server import LocalHub

pytest.importorskip("huggingface_hub")

TOKEN = "hf_valid_token"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    with LocalHub(tmp_path) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("AIOLOADER_HF_CACHE", raising=False)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        # No token file of the machine's own login may reach the local Hub.
        monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
        yield server


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def _sharded(tmp_path: Path, hub: LocalHub, repo: str, seed: int = 1) -> tuple[str, list[Path]]:
    folder = tmp_path / f"src-{seed}"
    write_sharded(folder, some_big(seed), shards=3)
    (folder / "config.json").write_text('{"model_type": "test"}')
    sha = hub.commit(repo, _files(folder))
    return sha, sorted(folder.glob("*.safetensors"))


async def test_a_sharded_repo_loads_bit_for_bit(hub: LocalHub, tmp_path: Path) -> None:
    sha, shards = _sharded(tmp_path, hub, "org/sharded")
    assert_matches_files(await load_model("hf://org/sharded"), *shards)
    assert_matches_files(await load_model(f"hf://org/sharded@{sha}"), *shards)
    hub.tag(hub_repo := "org/sharded", "v1", sha)
    assert_matches_files(await load_model(f"hf://{hub_repo}@v1/"), *shards)
    got = await load_model("hf://org/sharded@main/model.safetensors.index.json")
    assert_matches_files(got, *shards)


async def test_single_file_subfolder_and_file_url(hub: LocalHub, tmp_path: Path) -> None:
    one = write_file(tmp_path / "a" / "model.safetensors", random_tensors(3))
    sub = write_file(tmp_path / "a" / "sub" / "folder" / "weights.safetensors", random_tensors(4))
    hub.commit("org/files", _files(tmp_path / "a"))
    assert_matches_files(await load_model("hf://org/files"), one)
    assert_matches_files(await load_model("hf://org/files@main/sub/folder"), sub)
    assert_matches_files(await load_model("hf://org/files@main/sub/folder/"), sub)
    got = await load_model("hf://org/files@main/sub/folder/weights.safetensors")
    assert_matches_files(got, sub)


async def test_tensors_rows_stream_and_inspect(hub: LocalHub, tmp_path: Path) -> None:
    _sha, shards = _sharded(tmp_path, hub, "org/m")
    reference: dict[str, torch.Tensor] = {}
    for shard in shards:
        reference.update(load_file(shard))
    got = await load_model("hf://org/m", tensors=["big.1", "layer.3.weight"])
    assert_same(got, {k: reference[k] for k in ("big.1", "layer.3.weight")})
    got = await load_model("hf://org/m", tensors=["big.2"], rows={"big.2": (10, 20)})
    assert torch.equal(got["big.2"], reference["big.2"][10:20])
    async with Loader() as loader:
        streamed = {name: tensor.clone() async for name, tensor in loader.stream("hf://org/m")}
    assert_same(streamed, reference)
    info = await inspect_model("hf://org/m")
    assert sum(len(h.tensors) for h in info.headers) == len(reference)
    assert len(info.layout.files) == 3 and info.layout.index is not None


async def test_through_the_node_cache(hub: LocalHub, tmp_path: Path) -> None:
    _sha, shards = _sharded(tmp_path, hub, "org/cached")
    cache = tmp_path / "cache"
    assert_matches_files(await load_model("hf://org/cached", cache_dir=cache), *shards)
    storage_gets = len(hub.storage.gets())
    assert_matches_files(await load_model("hf://org/cached", cache_dir=cache), *shards)
    # A warm load asks each file's version (one probe each) and reads nothing more.
    again = hub.storage.gets()[storage_gets:]
    assert len(again) == len(shards)
    assert all(r.range == f"bytes=0-{PROBE_SIZE - 1}" for r in again), again
    assert len(list((cache).rglob("*"))) > 0


async def test_a_branch_moved_mid_load_gives_the_first_commit(
    hub: LocalHub, tmp_path: Path
) -> None:
    _first, first_shards = _sharded(tmp_path, hub, "org/moving", seed=1)
    second, second_shards = _sharded(tmp_path, hub, "org/moving", seed=2)
    _first = hub.commit("org/moving", _files(tmp_path / "src-1"))
    hub.move_after_first("org/moving", "main", second)
    async with Loader() as loader:
        assert_matches_files(await loader.load("hf://org/moving"), *first_shards)
        # The next load sees where the branch points now.
        assert_matches_files(await loader.load("hf://org/moving"), *second_shards)
    resolves = [r.path for r in hub.log if "/resolve/" in r.path]
    assert resolves and all(_first in p or second in p for p in resolves)
    assert not any("/resolve/main/" in p for p in resolves)


async def test_the_token_reaches_the_hub_and_never_the_storage_host(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sha, shards = _sharded(tmp_path, hub, "org/private")
    hub.private("org/private", {TOKEN})
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert_matches_files(await load_model("hf://org/private"), *shards)
    assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in hub.log)
    assert hub.storage.request_headers, "the LFS files were not redirected to storage"
    for headers in hub.storage.request_headers:
        assert not any(k.lower() == "authorization" for k in headers), headers


async def test_the_token_file_of_a_login_is_used(hub: LocalHub, tmp_path: Path) -> None:
    _sha, _shards = _sharded(tmp_path, hub, "org/login")
    hub.private("org/login", {TOKEN})
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text(TOKEN)
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN_PATH"}
    out = _cli("load", "hf://org/login", "--json", env={**env, "HF_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"] == 3


async def test_storage_faults_are_retried(hub: LocalHub, tmp_path: Path) -> None:
    _sha, shards = _sharded(tmp_path, hub, "org/flaky")
    hub.storage.status(None, 503, count=2)
    hub.storage.short_body(None, count=2)
    assert_matches_files(await load_model("hf://org/flaky", max_attempts=6), *shards)


async def test_storage_failing_for_good_is_a_read_error(hub: LocalHub, tmp_path: Path) -> None:
    _sharded(tmp_path, hub, "org/down")
    hub.storage.status(None, 500, count=1000)
    with pytest.raises(ReadError):
        await load_model("hf://org/down", max_attempts=2)


async def test_gated_private_and_wrong_token_errors(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sharded(tmp_path, hub, "org/gated")
    hub.gated("org/gated", {TOKEN})
    with pytest.raises(AccessDeniedError, match=r"gated.*no Hugging Face token.*huggingface-cli"):
        await load_model("hf://org/gated")
    _sharded(tmp_path, hub, "org/secret", seed=3)
    hub.private("org/secret", {TOKEN})
    with pytest.raises(AccessDeniedError, match=r"org/secret@main.*huggingface-cli login"):
        await load_model("hf://org/secret")
    hub.valid_tokens.add("hf_other")
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(AccessDeniedError, match=r"accept its licence on http://127"):
        await load_model("hf://org/gated")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(AccessDeniedError, match=r"refused the token"):
        await load_model("hf://org/gated")


async def test_missing_repo_revision_and_file(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sharded(tmp_path, hub, "org/here")
    with pytest.raises(NotFoundError, match=r"org/here@nope.*no revision 'nope'"):
        await load_model("hf://org/here@nope")
    with pytest.raises(NotFoundError, match=r"no file or folder named 'absent\.safetensors'"):
        await load_model("hf://org/here@main/absent.safetensors")
    with pytest.raises(NotFoundError, match=r"no file or folder named 'sub'"):
        await load_model("hf://org/here@main/sub")
    with pytest.raises(AccessDeniedError, match=r"org/gone@main.*check the name"):
        await load_model("hf://org/gone")
    hub.valid_tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(NotFoundError, match=r"org/gone@main.*does not exist"):
        await load_model("hf://org/gone")


async def test_offline_mode_says_what_is_missing(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sharded(tmp_path, hub, "org/off")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NotFoundError, match=r"HF_HUB_OFFLINE is set.*no ref 'main' of org/off"):
        await load_model("hf://org/off")
    assert hub.log == []


async def test_an_unreachable_hub_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(SourceError, match=r"could not be reached.*HF_ENDPOINT"):
        await load_model("hf://org/any")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aioloader", *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def test_the_cli_loads_and_inspects(hub: LocalHub, tmp_path: Path) -> None:
    _sharded(tmp_path, hub, "org/cli")
    out = _cli("load", "hf://org/cli", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"] == 3
    out = _cli("inspect", "hf://org/cli", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tensor_count"] == len(some_big(1))
    out = _cli("load", "hf://org/cli@nope")
    assert out.returncode == 1 and "no revision 'nope'" in out.stderr
    assert "Traceback" not in out.stderr
