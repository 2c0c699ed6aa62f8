"""Checksums of cache entries: recorded as they are written, checked on demand, and
downloads checked against an MD5 S3 publishes as its ETag (no other server's)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import uuid
from pathlib import Path

import pytest
import torch
import xxhash

from aioloader import CacheError, ModelCache, load_model
from aioloader.cache.entry import key_of

from .helpers import assert_matches_files, random_tensors, write_file
from .servers import FaultyHttpServer, MotoS3Server


def entry_dir(root: Path, url: str) -> Path:
    return root / "entries" / key_of(url)


def meta_of(root: Path, url: str) -> dict[str, object]:
    return json.loads((entry_dir(root, url) / "meta.json").read_text())  # type: ignore[no-any-return]


def xxh3(path: Path) -> str:
    return "xxh3-128:" + xxhash.xxh3_128(path.read_bytes()).hexdigest()


def rot(path: Path, offset: int) -> None:
    """Flip one bit in place, as a failing disk would: same size, same mtime."""
    with path.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x10]))


@pytest.fixture
def files(http_server: FaultyHttpServer) -> dict[str, Path]:
    out = {}
    for i, name in enumerate("abc"):
        tensors = random_tensors(seed=i, count=12)
        tensors["big"] = torch.randn(300_000, generator=torch.Generator().manual_seed(i))
        out[name] = write_file(http_server.root / f"{name}.safetensors", tensors)
    return out


async def test_every_entry_records_its_checksum_as_it_is_written(
    http_server: FaultyHttpServer, files: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    url = {n: http_server.url_for(f"{n}.safetensors") for n in files}
    await ModelCache(root).fetch(url["a"], chunk_size="4KiB", concurrency=4)
    await load_model(url["b"], cache_dir=root, chunk_size="4KiB", concurrency=4)
    # Resumed: a partial load first, the rest fetched later.
    await load_model(url["c"], cache_dir=root, tensors=["layer.5.weight"], chunk_size="4KiB")
    assert meta_of(root, url["c"])["complete"] is False
    await ModelCache(root).fetch(url["c"], chunk_size="4KiB", concurrency=4)
    await ModelCache(root).wait_committed()  # b's load commits its entry after it returns
    for name, path in files.items():
        data = entry_dir(root, url[name]) / "data"
        assert data.read_bytes() == path.read_bytes()
        assert meta_of(root, url[name])["checksum"] == xxh3(path)
    results = await ModelCache(root).verify()
    assert sorted(r.url for r in results) == sorted(url.values())
    assert all(r.ok and r.status == "ok" for r in results), results


async def test_bit_rot_is_found_removed_and_fetched_again(
    http_server: FaultyHttpServer, files: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    cache = ModelCache(root)
    url = {n: http_server.url_for(f"{n}.safetensors") for n in files}
    models = [await cache.fetch(url[n]) for n in "ab"]
    rot(entry_dir(root, url["a"]) / "data", files["a"].stat().st_size - 3)

    [bad] = await cache.verify(url["a"])
    assert bad.status == "corrupt" and not bad.ok and bad.removed
    assert url["a"] in bad.detail and "xxh3-128" in bad.detail
    assert [e.url for e in cache.entries()] == [url["b"]]
    assert not Path(str(models[0].path)).is_symlink()  # its link went with it
    [good] = await cache.verify(url["b"])
    assert good.ok
    [missing] = await cache.verify(url["c"])
    assert missing.status == "missing" and not missing.ok

    # The next load downloads the file again, and gets the server's bytes.
    http_server.reset_counters()
    assert_matches_files(await load_model(url["a"], cache_dir=root), files["a"])
    assert http_server.bytes_sent >= files["a"].stat().st_size
    assert [r.status for r in await cache.verify()] == ["ok", "ok"]


def s3_objects(
    server: MotoS3Server, files: dict[str, Path], etags: dict[str, str]
) -> dict[str, str]:
    """``files`` uploaded to a new bucket of ``server`` in one part each and without a
    checksum (so S3 publishes only its ETag, the MD5 of the bytes), then the ETags of
    ``etags`` set as a store whose ETags only look like MD5s has them; URLs by name."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    bucket = f"aiol-{uuid.uuid4().hex[:16]}"
    client = server.client()
    client.create_bucket(Bucket=bucket)
    for name, path in files.items():
        client.put_object(Bucket=bucket, Key=f"m/{name}", Body=path.read_bytes())
        key = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, f"m/{name}")
        key.checksum_algorithm = key.checksum_value = None  # no x-amz-checksum-*: the ETag
        if name in etags:
            key._etag = etags[name]
    return {name: f"s3://{bucket}/m/{name}" for name in files}


async def test_md5_etags_of_s3_are_checked(
    s3_env: MotoS3Server, files: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    md5 = {n: hashlib.md5(p.read_bytes()).hexdigest() for n, p in files.items()}
    url = s3_objects(s3_env, files, {"b": md5["c"]})  # not b's bytes' MD5
    cache = ModelCache(root)

    caplog.set_level("INFO", logger="aioloader")
    await cache.fetch(url["a"])  # a single-part upload's ETag: its MD5
    assert meta_of(root, url["a"])["complete"] is True
    assert f"{url['a']}: the download matches the md5 of the server's ETag" in caplog.text
    with pytest.raises(CacheError) as info:
        await cache.fetch(url["b"], chunk_size="4KiB")
    message = str(info.value)
    assert url["b"] in message and md5["c"] in message and md5["b"] in message
    assert "SSE-KMS" in message and "check_etag=False" in message
    entry = entry_dir(root, url["b"])
    assert not (entry / "data").exists() and not (entry / "data.partial").exists()
    assert not (entry / "meta.json").exists()

    # Where the ETag is known not to be an MD5, the check can be off.
    model = await ModelCache(root, check_etag=False).fetch(url["b"])
    assert_matches_files(await load_model(str(model.path)), files["b"])


async def test_a_plain_http_etag_of_32_hex_digits_is_no_md5(
    http_server: FaultyHttpServer, files: dict[str, Path], tmp_path: Path
) -> None:
    """A plain HTTP server may make its ETags of 32 hex digits from anything (a hash of
    the path and time, say): the correct download was discarded as corrupt."""
    root = tmp_path / "cache"
    url = http_server.url_for("a.safetensors")
    http_server.set_etag("a.safetensors", '"0123456789abcdef0123456789abcdef"')
    model = await ModelCache(root).fetch(url)
    assert meta_of(root, url)["complete"] is True
    assert_matches_files(await load_model(str(model.path)), files["a"])
    assert [r.status for r in await ModelCache(root).verify()] == ["ok"]


async def test_cache_verify_on_the_command_line(
    http_server: FaultyHttpServer, files: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    url = {n: http_server.url_for(f"{n}.safetensors") for n in files}
    for name in "ab":
        await ModelCache(root).fetch(url[name])

    async def verify(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aioloader", "cache", "verify", "--cache-dir", str(root),
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode()

    code, out = await verify()
    assert code == 0, out
    assert f"ok {url['a']}" in out and f"ok {url['b']}" in out
    rot(entry_dir(root, url["b"]) / "data", 100)
    code, out = await verify(url["a"])
    assert code == 0 and url["b"] not in out, out
    code, out = await verify()
    assert code == 1, out
    assert f"corrupt {url['b']}" in out and "removed" in out and f"ok {url['a']}" in out
