"""``aioloader fetch`` (folder_copy.py, folder_dest.py): sub-folders, names with ``#`` and
``?``, a second version fetched into the same DEST, and a DEST that cannot be written."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import pytest
from safetensors.torch import save

from aioloader import CacheError, SourceError, load_model
from aioloader.fetch.copy import PARTIAL_PREFIX, RECORD, copy_folder

from .helpers import random_tensors, write_sharded
from .http_server import FaultyHttpServer
from .s3_server import MotoS3Server

# A sentence-transformers model's folder, as all-MiniLM-L6-v2 has it.
SENTENCE = {
    "config.json": b'{"model_type": "bert"}',
    "modules.json": b'[{"idx": 1, "path": "1_Pooling", "type": "Pooling"}]',
    "1_Pooling/config.json": b'{"word_embedding_dimension": 384}',
    "2_Dense/sub/deeper.json": b"{}",
}


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but fetch's record."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p != folder / RECORD
    }


def _write(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def _sentence_model(seed: int = 0) -> dict[str, bytes]:
    return {**SENTENCE, "model.safetensors": save(random_tensors(seed=seed, count=4))}


def _fetch(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aioloader", "fetch", *args],
        capture_output=True, text=True, timeout=120, check=False, **kwargs,
    )  # fmt: skip


# -- sub-folders (issue 33, item 2) ----------------------------------------------------------


def test_local_folder_with_sub_folders_through_the_command(tmp_path: Path) -> None:
    want = _sentence_model()
    _write(tmp_path / "src", {**want, ".cache/x": b"hidden", "1_Pooling/.hidden": b"no"})
    dest = tmp_path / "dest"
    out = _fetch(str(tmp_path / "src"), str(dest))
    assert out.returncode == 0, out.stderr
    assert _files(dest) == want  # hidden names at any depth are not copied
    assert sorted(out.stdout.split()) == sorted(want)
    assert not list(dest.glob(PARTIAL_PREFIX + "*"))


async def test_hf_repo_with_sub_folders(tmp_path: Path, hub: Any) -> None:
    want = _sentence_model(seed=1)
    hub.commit("sentence-transformers/all-MiniLM-L6-v2", {**want, ".gitattributes": b"*"})
    done = await copy_folder("hf://sentence-transformers/all-MiniLM-L6-v2", tmp_path / "d")
    assert _files(tmp_path / "d") == want
    assert sorted(done.files) == sorted(want)


async def test_s3_folder_with_sub_folders(tmp_path: Path, s3_env: MotoS3Server) -> None:
    want = _sentence_model(seed=2)
    _write(tmp_path / "src", want)
    s3_env.create_bucket("fetch-sub")
    s3_env.upload("fetch-sub", "org/model", tmp_path / "src")
    await copy_folder("s3://fetch-sub/org/model/", tmp_path / "dest")
    assert _files(tmp_path / "dest") == want


async def test_s3_folder_marker_is_a_folder(tmp_path: Path, s3_env: MotoS3Server) -> None:
    s3_env.create_bucket("fetch-marker")
    s3_env.put_object("fetch-marker", "m/model.safetensors", save(random_tensors(count=2)))
    s3_env.put_object("fetch-marker", "m/empty/", b"")  # what a console's "new folder" makes
    s3_env.put_object("fetch-marker", "m/1_Pooling/", b"")
    s3_env.put_object("fetch-marker", "m/1_Pooling/config.json", b"{}")
    done = await copy_folder("s3://fetch-marker/m/", tmp_path / "dest")
    assert sorted(done.files) == ["1_Pooling/config.json", "model.safetensors"]


def test_gcs_folder_with_sub_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gcp_storage_emulator")
    from .gcs_server import GcsEmulator

    want = _sentence_model(seed=3)
    with GcsEmulator() as gcs:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        gcs.create_bucket("fetch-sub")
        for name, data in want.items():
            gcs.put("fetch-sub", f"org/model/{name}", data)
        gcs.put("fetch-sub", "org/model-b/config.json", b"{}")  # a sibling: not copied
        out = _fetch("gs://fetch-sub/org/model/", str(tmp_path / "dest"))
    assert out.returncode == 0, out.stderr
    assert _files(tmp_path / "dest") == want


def _azure_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    for name in ("AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountName=acct;BlobEndpoint={url}")


async def test_azure_listing_names_sub_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    from aioloader.runtime.threads import Lanes
    from aioloader.sources.azure.source import AzureSource

    from .test_listings import DocServer

    body = (
        b"<EnumerationResults><Blobs><Blob><Name>llm/config.json</Name></Blob>"
        b"<BlobPrefix><Name>llm/1_Pooling/</Name></BlobPrefix></Blobs></EnumerationResults>"
    )
    async with DocServer(body) as server:
        _azure_at(monkeypatch, f"{server.url}/acct")
        lanes = Lanes(2)
        source = AzureSource(lanes)
        try:
            assert await source.list_dir("az://box/llm/") == ["1_Pooling/", "config.json"]
        finally:
            await source.aclose()
            lanes.close()


async def test_a_listing_that_never_ends_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .test_listings import DocServer

    class Deeper(DocServer):
        """Every folder it lists holds a sub-folder ``a/``."""

        async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    request = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                query = parse_qs(urlsplit(request.split()[1].decode()).query)
                name = escape(query["prefix"][0] + "a/").encode()
                body = b"<EnumerationResults><Blobs><BlobPrefix><Name>" + name
                body += b"</Name></BlobPrefix></Blobs></EnumerationResults>"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()

    async with Deeper(b"") as server:
        _azure_at(monkeypatch, f"{server.url}/acct")
        with pytest.raises(SourceError, match="nests folders more than 32 deep"):
            await copy_folder("az://box/llm/", tmp_path / "dest")


async def test_a_link_planted_in_dest_is_not_written_through(tmp_path: Path) -> None:
    _write(tmp_path / "src", _sentence_model())
    (tmp_path / "dest").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "dest" / "1_Pooling").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheError, match="1_Pooling is not a folder"):
        await copy_folder(str(tmp_path / "src"), tmp_path / "dest")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert not list((tmp_path / "dest").glob(PARTIAL_PREFIX + "*"))


async def test_a_link_to_a_folder_in_the_source_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "src", _sentence_model())
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("not part of the model")
    (tmp_path / "src" / "linked").symlink_to(tmp_path / "outside")
    with pytest.raises(SourceError, match="linked"):
        await copy_folder(str(tmp_path / "src"), tmp_path / "dest")
    assert _files(tmp_path / "dest") == {}


# -- '#' and '?' in names (item 10) ------------------------------------------------------------


async def test_hash_and_question_mark_in_hf_names(tmp_path: Path, hub: Any) -> None:
    want = {**_sentence_model(seed=3), "a#b.txt": b"hash", "c?d.txt": b"query", "e%20f": b"pc"}
    want["1_Pooling/g#h?.json"] = b"{}"
    hub.commit("org/odd-names", want)
    await copy_folder("hf://org/odd-names", tmp_path / "dest")
    assert _files(tmp_path / "dest") == want


async def test_hash_and_question_mark_in_http_shard_names(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    tensors = random_tensors(seed=4, count=4)
    keys = sorted(tensors)
    weight_map = {}
    for shard, part in (("model#1.safetensors", keys[:2]), ("model?2.safetensors", keys[2:])):
        (http_server.root / shard).write_bytes(save({k: tensors[k] for k in part}))
        weight_map |= dict.fromkeys(part, shard)
    index = json.dumps({"weight_map": weight_map}).encode()
    (http_server.root / "model.safetensors.index.json").write_bytes(index)
    (http_server.root / "config.json").write_bytes(b"{}")
    await copy_folder(http_server.url_for("model.safetensors.index.json"), tmp_path / "dest")
    want = {
        n: (http_server.root / n).read_bytes() for n in [*set(weight_map.values()), "config.json"]
    }
    assert _files(tmp_path / "dest") == {**want, "model.safetensors.index.json": index}


async def test_hf_index_and_single_file_urls(tmp_path: Path, hub: Any) -> None:
    tensors = random_tensors(seed=5, count=4)
    keys = sorted(tensors)
    shard = save({k: tensors[k] for k in keys})
    index = json.dumps({"weight_map": dict.fromkeys(keys, "model-1.safetensors")}).encode()
    files = {"model-1.safetensors": shard, "model.safetensors.index.json": index}
    hub.commit("org/indexed", {**files, "config.json": b"{}", "other.txt": b"not named"})
    await copy_folder("hf://org/indexed/model.safetensors.index.json", tmp_path / "a")
    assert _files(tmp_path / "a") == {**files, "config.json": b"{}"}
    await copy_folder("hf://org/indexed/model-1.safetensors", tmp_path / "b")
    assert _files(tmp_path / "b") == {"model-1.safetensors": shard, "config.json": b"{}"}


# -- a second version into the same DEST (item 8) ---------------------------------------------


def _sharded(folder: Path, seed: int, shards: int) -> dict[str, bytes]:
    write_sharded(folder, random_tensors(seed=seed, count=9), shards=shards)
    _write(folder, SENTENCE)
    return _files(folder)


async def _loaded(folder: Path) -> dict[str, Any]:
    return await load_model(str(folder))


@pytest.mark.parametrize(("old_shards", "new_shards"), [(3, 0), (3, 2), (2, 2), (0, 3)], ids=str)
async def test_a_new_version_replaces_the_old_one(
    tmp_path: Path, old_shards: int, new_shards: int, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")

    def version(name: str, seed: int, shards: int) -> dict[str, bytes]:
        folder = tmp_path / name
        if shards:
            return _sharded(folder, seed, shards)
        single = {"model.safetensors": save(random_tensors(seed=seed, count=9))}
        _write(folder, {"config.json": b"{}", "single-file.txt": b"x", **single})
        return _files(folder)

    old, _ = version("v1", 10, old_shards), version("v2", 20, new_shards)
    shutil.rmtree(tmp_path / "v2" / "1_Pooling", ignore_errors=True)  # the new one lacks it
    new = _files(tmp_path / "v2")
    dest = tmp_path / "dest"
    await copy_folder(str(tmp_path / "v1"), dest)
    assert _files(dest) == old
    (dest / "notes.txt").write_text("the user's own")
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        await copy_folder(str(tmp_path / "v2"), dest)
    assert _files(dest) == {**new, "notes.txt": b"the user's own"}
    assert not (dest / "1_Pooling").exists()
    assert json.loads((dest / RECORD).read_text())["files"] == sorted(new)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    got = await _loaded(dest)
    want = await _loaded(tmp_path / "v2")
    assert got.keys() == want.keys()
    for key, tensor in want.items():
        bits = [t.reshape(-1).view(torch.uint8) for t in (got[key], tensor)]
        assert got[key].dtype == tensor.dtype and torch.equal(*bits), key


async def test_weights_fetch_did_not_write_stay_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(tmp_path / "src", _sentence_model(seed=5))
    stray = save(random_tensors(seed=6, count=2))
    _write(tmp_path / "dest", {"old.safetensors": stray})
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        await copy_folder(str(tmp_path / "src"), tmp_path / "dest")
    assert (tmp_path / "dest" / "old.safetensors").read_bytes() == stray
    assert any("old.safetensors was not written by aioloader fetch" in m for m in caplog.messages)


async def test_a_commit_killed_midway_is_finished_by_the_next_fetch(tmp_path: Path) -> None:
    old = _sharded(tmp_path / "v1", seed=11, shards=3)
    new = _sharded(tmp_path / "v2", seed=12, shards=2)
    dest = tmp_path / "dest"
    await copy_folder(str(tmp_path / "v1"), dest)
    # What a fetch of v2 killed while committing leaves: the record names both versions,
    # the old shards are partly removed, one new shard is in place, its partial folder.
    record = json.loads((dest / RECORD).read_text())
    record["files"] = sorted({*old, *new})
    (dest / RECORD).write_text(json.dumps(record))
    (dest / "model-00001-of-00003.safetensors").unlink()
    shutil.copy(tmp_path / "v2" / "model-00002-of-00002.safetensors", dest)
    (dest / (PARTIAL_PREFIX + "killed")).mkdir()
    await copy_folder(str(tmp_path / "v2"), dest)
    assert _files(dest) == new


async def test_a_tampered_record_removes_nothing_outside(tmp_path: Path) -> None:
    _write(tmp_path / "src", _sentence_model(seed=7))
    (tmp_path / "victim").write_text("keep me")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / RECORD).write_text(json.dumps({"files": ["../victim", "config.json"]}))
    await copy_folder(str(tmp_path / "src"), dest)
    assert (tmp_path / "victim").read_text() == "keep me"
    assert _files(dest) == _files(tmp_path / "src")


# -- a DEST that cannot be written (item 14) ---------------------------------------------------


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = "mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"
    done = subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True, check=False)
    return done.returncode == 0


def _fetch_onto(tmp_path: Path, mount_options: str) -> tuple[str, str]:
    """Fetch into a fresh tmpfs mounted with ``mount_options`` (a private mount namespace);
    returns the command's stderr and what DEST holds afterwards."""
    if not _can_mount():
        pytest.skip("cannot mount a tmpfs here (needs unshare and CAP_SYS_ADMIN)")
    _write(tmp_path / "src", {**_sentence_model(seed=8), "big.bin": os.urandom(300_000)})
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f'mount -t tmpfs -o {mount_options} tmpfs "{disk}" || exit 99\n'
        f'"{sys.executable}" -m aioloader fetch "{tmp_path / "src"}" "{disk / "dest"}" '
        f'2>"{tmp_path / "err"}"\n'
        'echo "rc=$?"\n'
        f'find "{disk}" -mindepth 1 >"{tmp_path / "left"}"\n'
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.stdout.strip() == "rc=1", (done.stdout, done.stderr)
    return (tmp_path / "err").read_text(), (tmp_path / "left").read_text()


def test_full_dest_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    err, left = _fetch_onto(tmp_path, "size=128k")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"aioloader: error: aioloader fetch into {tmp_path / 'disk' / 'dest'}")
    assert "No space left on device" in err and "free space" in err
    assert left.split() == [str(tmp_path / "disk" / "dest")]  # the folder, empty


def test_read_only_dest_is_one_line(tmp_path: Path) -> None:
    err, left = _fetch_onto(tmp_path, "ro")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"aioloader fetch into {tmp_path / 'disk' / 'dest'}" in err
    assert "Read-only file system" in err and "not writable" in err
    assert left == ""


def test_file_size_limit_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """Runs anywhere: a file-size limit fails the writes as a full disk does."""
    _write(tmp_path / "src", {**_sentence_model(seed=9), "big.bin": os.urandom(300_000)})
    dest = tmp_path / "dest"
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "from aioloader.cli import main\n"
        f"sys.exit(main(['fetch', {str(tmp_path / 'src')!r}, {str(dest)!r}]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"aioloader fetch into {dest}: creating big.bin failed (File too large)" in out.stderr
    assert list(dest.iterdir()) == []
