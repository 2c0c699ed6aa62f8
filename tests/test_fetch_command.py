"""``aioloader fetch SRC DEST`` (folder_copy.py), run as KServe's storage initializer is."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aioloader import ConfigError, ObjectChangedError, ReadError, SourceError
from aioloader.fetch.copy import PARTIAL_PREFIX, RECORD, copy_folder

from .helpers import random_tensors, some_big, write_sharded
from .http_server import FaultyHttpServer
from .s3_server import MotoS3Server

CONFIGS = {
    "config.json": b'{"model_type": "test"}',
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b"{}",
}


def _model(folder: Path, seed: int = 0) -> dict[str, bytes]:
    """A sharded model with config and tokenizer files; returns name -> bytes."""
    write_sharded(folder, some_big(seed), shards=3)
    for name, data in CONFIGS.items():
        (folder / name).write_bytes(data)
    return _files(folder)


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but fetch's record of what it wrote."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p != folder / RECORD
    }


def _fetch(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aioloader", "fetch", *args],
        capture_output=True, text=True, timeout=120, check=False, **kwargs,
    )  # fmt: skip


def _no_partials(dest: Path) -> bool:
    return not list(dest.glob(PARTIAL_PREFIX + "*"))


def test_local_folder_through_the_command(tmp_path: Path) -> None:
    want = _model(tmp_path / "src")
    dest = tmp_path / "mnt" / "models"
    out = _fetch(str(tmp_path / "src"), str(dest))
    assert out.returncode == 0, out.stderr
    assert _files(dest) == want and _no_partials(dest)
    assert sorted(out.stdout.split()) == sorted(want)
    assert "fetched 7 files" in out.stderr


async def test_http_index_brings_shards_and_configs(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    want = _model(http_server.root / "m")
    (http_server.root / "m" / "unrelated.bin").write_bytes(b"not named anywhere")
    dest = tmp_path / "dest"
    done = await copy_folder(
        http_server.url_for("m/model.safetensors.index.json"), dest, concurrency=4,
        chunk_size="256KiB",
    )  # fmt: skip
    assert _files(dest) == want  # no unrelated.bin: only what the index and names find
    assert done.bytes == sum(len(b) for b in want.values())
    # Concurrent range reads, as a load makes them.
    assert len([h for h in http_server.request_headers if "Range" in h]) > 6


async def test_s3_folder(tmp_path: Path, s3_env: MotoS3Server) -> None:
    want = _model(tmp_path / "src", seed=2)
    s3_env.create_bucket("fetch-folder")
    s3_env.upload("fetch-folder", "org/model", tmp_path / "src")
    dest = tmp_path / "dest"
    await copy_folder("s3://fetch-folder/org/model/", dest, chunk_size="1MiB")
    assert _files(dest) == want


async def test_s3_published_checksum_mismatch_is_refused(
    tmp_path: Path, s3_env: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    _model(tmp_path / "src", seed=3)
    s3_env.create_bucket("fetch-checksum")
    s3_env.upload("fetch-checksum", "m", tmp_path / "src")
    from aioloader.sources.s3.source import S3Source

    async def lying(self: Any, url: str) -> dict[str, str]:
        return {"x-amz-checksum-sha256": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}

    monkeypatch.setattr(S3Source, "object_checksums", lying)
    dest = tmp_path / "dest"
    with pytest.raises(SourceError, match="do not match the sha256"):
        await copy_folder("s3://fetch-checksum/m/", dest)
    assert _files(dest) == {}


async def test_hf_snapshot(tmp_path: Path, hub: Any) -> None:
    want = _model(tmp_path / "src", seed=4)
    hub.commit("org/fetched", want)
    dest = tmp_path / "dest"
    await copy_folder("hf://org/fetched", dest)
    assert _files(dest) == want


# -- a lying server ----------------------------------------------------------------------


async def test_truncated_body_fails_clean(tmp_path: Path, http_server: FaultyHttpServer) -> None:
    _model(http_server.root)
    http_server.short_body("model-00002-of-00003.safetensors", count=100)
    dest = tmp_path / "dest"
    with pytest.raises(ReadError, match="model-00002"):
        await copy_folder(
            http_server.url_for("model.safetensors.index.json"), dest, max_attempts=2,
            backoff=0.01,
        )  # fmt: skip
    assert _files(dest) == {} and _no_partials(dest)


async def test_changed_mid_copy_fails_clean(tmp_path: Path, http_server: FaultyHttpServer) -> None:
    _model(http_server.root)
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "keep.txt").write_text("was here before")
    http_server.change_after("model-00001-of-00003.safetensors", requests=2)
    with pytest.raises(ObjectChangedError):
        await copy_folder(
            http_server.url_for("model.safetensors.index.json"), tmp_path / "dest",
            chunk_size="64KiB", concurrency=2,
        )  # fmt: skip
    assert _files(tmp_path / "dest") == {"keep.txt": b"was here before"}


async def test_missing_shard_fails_clean(tmp_path: Path, http_server: FaultyHttpServer) -> None:
    _model(http_server.root)
    (http_server.root / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(SourceError, match="model-00003"):
        await copy_folder(http_server.url_for("model.safetensors.index.json"), tmp_path / "d")
    assert _files(tmp_path / "d") == {}


async def test_index_naming_a_file_outside_the_folder(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    (http_server.root / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "../../etc/passwd.safetensors"}}'
    )
    with pytest.raises(aioloader_errors()):
        await copy_folder(http_server.url_for("model.safetensors.index.json"), tmp_path / "d")
    assert not (tmp_path / "etc").exists()


def aioloader_errors() -> tuple[type[Exception], ...]:
    from aioloader import FormatError

    return (FormatError, SourceError)


# -- bad arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dest", "keywords", "match"),
    [
        (123, "d", {}, "source"),
        ("", "d", {}, "source"),
        ("   ", "d", {}, "source"),
        ("m", "", {}, "destination"),
        ("m", 3.5, {}, "destination"),
        ("m", "d", {"concurrency": 0}, "concurrency"),
        ("m", "d", {"chunk_size": "huge"}, "chunk_size"),
        ("m", "d", {"concurency": 2}, "concurrency"),
        ("ftp://host/model", "d", {}, "ftp"),
    ],
)
async def test_bad_arguments(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    src: Any,
    dest: Any,
    keywords: dict[str, Any],
    match: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # not os.chdir: later tests' commands run this checkout
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match=match):
        await copy_folder(src, dest, **keywords)
    assert not (tmp_path / "d").exists()


async def test_dest_that_is_a_file(tmp_path: Path) -> None:
    _model(tmp_path / "src")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        await copy_folder(str(tmp_path / "src"), tmp_path / "file")


async def test_empty_folder_and_huge_chunks(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="empty folder"):
        await copy_folder(str(tmp_path / "empty"), tmp_path / "d1")
    want = _model(tmp_path / "src")
    (tmp_path / "src" / "empty.txt").write_bytes(b"")
    await copy_folder(str(tmp_path / "src"), tmp_path / "d2", chunk_size="1GiB", concurrency=64)
    assert _files(tmp_path / "d2") == {**want, "empty.txt": b""}


def test_command_errors(tmp_path: Path) -> None:
    out = _fetch(str(tmp_path / "nowhere"), str(tmp_path / "d"))
    assert out.returncode == 1 and "aioloader: error:" in out.stderr
    assert str(tmp_path / "nowhere") in out.stderr and "Traceback" not in out.stderr
    assert _fetch().returncode == 2  # argparse: SRC and DEST are required


# -- crashes and company ------------------------------------------------------------------


def test_kill_9_mid_copy_leaves_no_half_file(tmp_path: Path, http_server: FaultyHttpServer) -> None:
    want = _model(http_server.root, seed=5)
    http_server.trickle("model-00002-of-00003.safetensors", bytes_per_second=20_000, count=1000)
    dest = tmp_path / "dest"
    url = http_server.url_for("model.safetensors.index.json")
    child = subprocess.Popen(
        [sys.executable, "-m", "aioloader", "fetch", url, str(dest), "--chunk-size", "64KiB"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list(dest.glob(PARTIAL_PREFIX + "*/*.safetensors")):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the copy never started")
        time.sleep(0.5)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # Nothing under a final name; only the partial folder the next copy removes.
    assert [p.name for p in dest.iterdir() if not p.name.startswith(PARTIAL_PREFIX)] == []
    http_server.clear_faults()
    out = _fetch(url, str(dest))
    assert out.returncode == 0, out.stderr
    assert _files(dest) == {n: b for n, b in want.items()} and _no_partials(dest)


def test_two_fetches_into_one_dest(tmp_path: Path) -> None:
    want = _model(tmp_path / "src", seed=6)
    dest = tmp_path / "dest"
    args = [sys.executable, "-m", "aioloader", "fetch", str(tmp_path / "src"), str(dest)]
    children = [
        subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert child.stderr is not None
        child.stderr.close()
    assert _files(dest) == want and _no_partials(dest)


def test_small_model_bytes_identical(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    src = tmp_path / "src"
    write_sharded(src, random_tensors(count=8), shards=2)
    out = _fetch(str(src / "model.safetensors.index.json"), str(tmp_path / "dest"))
    assert out.returncode == 0, out.stderr
    for shard in src.glob("*.safetensors"):
        got = load_file(str(tmp_path / "dest" / shard.name))
        want = load_file(str(shard))
        assert got.keys() == want.keys()


# -- Cloud Storage and Azure Blob, through the command -------------------------------------


def _assert_fetched(
    out: subprocess.CompletedProcess[str], dest: Path, want: dict[str, bytes]
) -> None:
    """Every file byte for byte, every tensor of every shard bit for bit."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load, load_file

    assert out.returncode == 0, out.stderr
    assert _files(dest) == want and _no_partials(dest)
    assert sorted(out.stdout.split()) == sorted(want)
    shards = [n for n in want if n.endswith(".safetensors")]
    assert len(shards) == 3
    for name in shards:
        got, expected = load_file(str(dest / name)), load(want[name])
        assert got.keys() == expected.keys()
        for key, tensor in expected.items():
            assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape
            bits = [t.reshape(-1).view(torch.uint8) for t in (got[key], tensor)]
            assert torch.equal(*bits), key


@pytest.fixture(scope="module")
def gcs_emulator() -> Iterator[Any]:
    pytest.importorskip("gcp_storage_emulator")
    from .gcs_server import GcsEmulator

    with GcsEmulator() as server:
        yield server


def test_gcs_folder_through_the_command(
    tmp_path: Path, gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    want = _model(tmp_path / "src", seed=7)
    gcs_emulator.upload("fetch-gcs", "org/model", tmp_path / "src")
    gcs_emulator.put("fetch-gcs", "org/other/config.json", b"{}")  # a sibling: not copied
    dest = tmp_path / "mnt" / "models"
    out = _fetch("gs://fetch-gcs/org/model/", str(dest), "--chunk-size", "256KiB")
    _assert_fetched(out, dest, want)
    assert "fetched 7 files" in out.stderr


@pytest.fixture(scope="module")
def azurite_server() -> Iterator[Any]:
    pytest.importorskip("azure.storage.blob")
    from .azure_server import AZURITE, AzuriteServer

    if not AZURITE.exists():
        pytest.skip("no Azurite (run scripts/azurite_setup.sh)")
    with AzuriteServer() as server:
        yield server


def test_azure_folder_through_the_command(
    tmp_path: Path, azurite_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_ACCOUNT_NAME",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_server.connection_string)
    want = _model(tmp_path / "src", seed=8)
    azurite_server.upload("fetch-azure", "org/model", tmp_path / "src")
    azurite_server.upload("fetch-azure", "org/model-b", tmp_path / "src")  # a sibling prefix
    dest = tmp_path / "mnt" / "models"
    out = _fetch("az://fetch-azure/org/model/", str(dest), "--chunk-size", "256KiB")
    _assert_fetched(out, dest, want)
    assert "fetched 7 files" in out.stderr


# -- a presigned URL (issue 42) ---------------------------------------------------------------

SIGNATURE = "X-Amz-Signature=5ec7e75ec7e7&X-Amz-Credential=AKIA%2Fsecret%2Fs3&token=a/b/c"


def test_a_presigned_urls_query_is_no_part_of_the_file_name(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    from safetensors.torch import load_file

    src = http_server.root / "m"
    write_sharded(src, random_tensors(count=4), shards=1)
    (shard,) = src.glob("*.safetensors")
    dest = tmp_path / "dest"
    out = _fetch(http_server.url_for(f"m/{shard.name}") + "?" + SIGNATURE, str(dest))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [shard.name]
    assert sorted(p.name for p in dest.iterdir()) == sorted([RECORD, shard.name])
    record = (dest / RECORD).read_text()
    for secret in ("5ec7e75ec7e7", "AKIA", "a/b/c", "a%2Fb"):
        assert secret not in out.stdout + out.stderr + record, secret
    got, want = load_file(str(dest / shard.name)), load_file(str(shard))
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].view(-1).view(torch_uint8()).equal(want[key].view(-1).view(torch_uint8()))
    # The file was read with its signature; siblings, which it does not sign, were not asked.
    gets = [q for r, q in zip(http_server.requests, http_server.query_strings, strict=True)
            if r.path.endswith(".safetensors")]  # fmt: skip
    assert gets and all("X-Amz-Signature" in q for q in gets)
    assert not [r for r in http_server.requests if r.path.endswith("config.json")]


@pytest.mark.parametrize("name", ["a%20b.safetensors", "%C3%A9t%C3%A9.safetensors"])
def test_a_file_name_is_the_decoded_last_segment_of_the_path(
    tmp_path: Path, http_server: FaultyHttpServer, name: str
) -> None:
    from urllib.parse import unquote

    from safetensors.torch import save_file

    torch = pytest.importorskip("torch")
    (http_server.root / "m").mkdir()
    save_file({"t": torch.arange(10)}, str(http_server.root / "m" / unquote(name)))
    out = _fetch(http_server.url_for("m") + "/" + name + "?sig=x", str(tmp_path / "dest"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dest" / unquote(name)).is_file()
    assert out.stdout.split("\n")[0] == unquote(name)


def torch_uint8() -> Any:
    return pytest.importorskip("torch").uint8


def test_a_failed_presigned_fetch_prints_no_signature(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    out = _fetch(http_server.url_for("m/missing.safetensors") + "?" + SIGNATURE, str(tmp_path))
    assert out.returncode == 1 and "missing.safetensors" in out.stderr
    assert "5ec7e75ec7e7" not in out.stderr + out.stdout and "AKIA" not in out.stderr


@pytest.mark.parametrize(
    ("tail", "name"),
    [
        ("a%2Fb.safetensors?sig=x", "a%2Fb.safetensors"),  # a %2F is no folder
        ("m.safetensors?name=../../etc/passwd", "m.safetensors"),
        ("m.safetensors?" + "x=" + "y" * 5000, "m.safetensors"),
        ("m.safetensors#frag?sig=x", "m.safetensors"),
    ],
)
def test_hostile_presigned_urls_name_their_file_safely(tail: str, name: str) -> None:
    from aioloader.fetch.files import _last_segment

    assert _last_segment("https://h.example/b/" + tail) == name


@pytest.mark.parametrize("tail", ["%2E%2E?sig=x", "%00.safetensors?sig=x"])
def test_a_presigned_url_whose_name_is_unsafe_is_refused(
    tmp_path: Path, http_server: FaultyHttpServer, tail: str
) -> None:
    (http_server.root / "m").mkdir()
    out = _fetch(http_server.url_for("m") + "/" + tail, str(tmp_path / "dest"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "dest").exists() or not any((tmp_path / "dest").iterdir())


async def test_an_s3_key_holding_a_question_mark_keeps_it_in_its_name(
    tmp_path: Path, s3_env: MotoS3Server
) -> None:
    """Only an http(s) URL has a query: an s3:// key's '?' is part of its name."""
    from safetensors.torch import save

    torch = pytest.importorskip("torch")
    data = save({"t": torch.arange(10)})
    s3_env.create_bucket("question")
    s3_env.put_object("question", "m/a?b.safetensors", data)
    dest = tmp_path / "dest"
    done = await copy_folder("s3://question/m/a?b.safetensors", dest)
    assert done.files == ("a?b.safetensors",)
    assert (dest / "a?b.safetensors").read_bytes() == data
