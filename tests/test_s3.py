"""S3 loads against moto's S3 server on 127.0.0.1 (see MotoS3Server for what moto checks).

moto keeps buckets in process-wide state, so every test makes buckets of its own.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aioloader import (
    AccessDeniedError,
    ConfigError,
    HttpOptions,
    Loader,
    NotFoundError,
    ObjectChangedError,
    ReadError,
    S3Options,
    SourceError,
    load_model,
)
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_matches_files, assert_same, random_tensors, write_file, write_sharded
from .servers import FaultyHttpServer, MotoS3Server

FAST = HttpOptions(backoff=0.01, backoff_max=0.05, stall_timeout=2.0)


def new_bucket() -> str:
    return f"aiol-{uuid.uuid4().hex[:16]}"


def big_tensors(count: int = 4, numel: int = 64 * 1024, seed: int = 0) -> dict[str, torch.Tensor]:
    """Small tensors of every kind, plus ``count`` of 256 KiB: beyond the probe."""
    gen = torch.Generator().manual_seed(seed)
    out = random_tensors(seed=seed, count=6)
    for i in range(count):
        out[f"big.{i:02d}"] = torch.randn(numel, generator=gen)
    return out


def sharded_model(folder: Path) -> list[Path]:
    write_sharded(folder, big_tensors(count=6), shards=3)
    return sorted(folder.glob("*.safetensors"))


# -- what gets loaded -------------------------------------------------------------------


async def test_prefix_with_index(s3_env: MotoS3Server, tmp_path: Path) -> None:
    bucket = new_bucket()
    shards = sharded_model(tmp_path / "model")
    # A stray file beside the shards is not part of the model the index describes.
    write_file(tmp_path / "model" / "stray.safetensors", {"other": torch.ones(3)})
    s3_env.upload(bucket, "models/llm", tmp_path / "model")
    async with Loader(chunk_size="256KiB") as loader:
        for url in (
            f"s3://{bucket}/models/llm/",
            f"s3://{bucket}/models/llm",
            f"s3://{bucket}/models/llm/model.safetensors.index.json",
        ):
            assert_matches_files(await loader.load(url), *shards)


async def test_single_key(s3_env: MotoS3Server, tmp_path: Path) -> None:
    bucket = new_bucket()
    path = write_file(tmp_path / "model.safetensors", big_tensors())
    s3_env.upload(bucket, "", path)
    got = await load_model(f"s3://{bucket}/model.safetensors", chunk_size="64KiB")
    assert_matches_files(got, path)


async def test_list_of_keys_and_selection(s3_env: MotoS3Server, tmp_path: Path) -> None:
    bucket = new_bucket()
    shards = sharded_model(tmp_path / "model")
    s3_env.upload(bucket, "m", tmp_path / "model")
    urls = [f"s3://{bucket}/m/{s.name}" for s in shards]
    assert_matches_files(await load_model(urls), *shards)
    reference: dict[str, torch.Tensor] = {}
    for shard in shards:
        reference.update(load_file(str(shard)))
    got = await load_model(f"s3://{bucket}/m/", tensors=["big.03", "layer.1.weight"])
    assert_same(got, {n: reference[n] for n in ("big.03", "layer.1.weight")})


async def test_prefix_without_index_loads_every_file(s3_env: MotoS3Server, tmp_path: Path) -> None:
    bucket = new_bucket()
    folder = tmp_path / "plain"
    a = write_file(folder / "a.safetensors", big_tensors(count=2, seed=1))
    b = write_file(folder / "b.safetensors", {"z": torch.arange(100)})
    # Deeper "folders" are not part of this one.
    write_file(folder / "sub" / "c.safetensors", {"deeper": torch.ones(2)})
    (folder / "README.md").write_text("not weights")
    s3_env.upload(bucket, "plain", folder)
    got = await load_model(f"s3://{bucket}/plain")
    assert_matches_files(got, a, b)


async def test_listing_follows_continuation_tokens(s3_env: MotoS3Server, tmp_path: Path) -> None:
    """ListObjectsV2 answers 1000 keys a page; the weights sort after the first page."""
    bucket = new_bucket()
    path = write_file(tmp_path / "zz-model.safetensors", big_tensors(count=1))
    s3_env.upload(bucket, "many", path)
    # 1001 PutObject requests to moto take ~10 s; its backend (the very one the server
    # serves from, in this process) takes them in a fraction of a second.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for i in range(1001):
        backend.put_object(bucket, f"many/log-{i:04d}.txt", b"x")
    with contextlib.closing(s3_env.client()) as client:
        page = client.list_objects_v2(Bucket=bucket, Prefix="many/", Delimiter="/")
        assert page["IsTruncated"] and len(page["Contents"]) == 1000
        assert all(not o["Key"].endswith(".safetensors") for o in page["Contents"])
    got = await load_model(f"s3://{bucket}/many/")
    assert_matches_files(got, path)


# -- credentials and addressing ---------------------------------------------------------


def write_profile(tmp_path: Path, profile: str, access_key: str, secret: str) -> Path:
    credentials = tmp_path / "aws-credentials"
    credentials.write_text(
        f"[{profile}]\naws_access_key_id = {access_key}\naws_secret_access_key = {secret}\n"
    )
    return credentials


def use_profile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server: MotoS3Server, secret: str
) -> None:
    """Credentials from a shared credentials file and AWS_PROFILE only."""
    server.set_env(monkeypatch, tmp_path)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    path = write_profile(tmp_path, "weights-reader", server.credentials[0], secret)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    monkeypatch.setenv("AWS_PROFILE", "weights-reader")


async def test_signed_with_environment_credentials(
    moto_auth_server: MotoS3Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    server = moto_auth_server
    server.set_env(monkeypatch, tmp_path)
    bucket = new_bucket()
    shards = sharded_model(tmp_path / "model")
    server.upload(bucket, "m", tmp_path / "model")
    got = await load_model(f"s3://{bucket}/m/", chunk_size="128KiB")
    assert_matches_files(got, *shards)

    access_key = server.credentials[0]
    secret = "wrong-secret-Zq81xv"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    for url in (f"s3://{bucket}/m/", f"s3://{bucket}/m/{shards[0].name}"):
        with pytest.raises(AccessDeniedError) as info:
            await load_model(url, http=FAST)
        message = str(info.value)
        assert url in message and "403" in message and "SignatureDoesNotMatch" in message
        assert "env" in message and f"{access_key[:4]}...{access_key[-4:]}" in message
        assert secret not in message and access_key not in message
        assert server.endpoint in message and "path-style" in message
        assert "AWS_ENDPOINT_URL" in message and "AWS_EC2_METADATA_DISABLED" in message


async def test_unknown_access_key(
    moto_auth_server: MotoS3Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    moto_auth_server.set_env(monkeypatch, tmp_path)
    bucket = new_bucket()
    moto_auth_server.create_bucket(bucket)
    moto_auth_server.put_object(bucket, "k.safetensors", b"\0" * 16)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOBODY0000000000")
    with pytest.raises(AccessDeniedError) as info:
        await load_model(f"s3://{bucket}/k.safetensors")
    assert "InvalidAccessKeyId" in str(info.value) and "AKIA...0000" in str(info.value)


async def test_shared_credentials_file_and_profile(
    moto_auth_server: MotoS3Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    server = moto_auth_server
    bucket = new_bucket()
    path = write_file(tmp_path / "m.safetensors", big_tensors(count=2))
    server.upload(bucket, "p", path)
    url = f"s3://{bucket}/p/m.safetensors"

    use_profile(monkeypatch, tmp_path, server, server.credentials[1])
    assert_matches_files(await load_model(url), path)

    # The same profile with a bad secret: the error says where the key came from.
    use_profile(monkeypatch, tmp_path, server, "bad-secret-Pw27")
    with pytest.raises(AccessDeniedError) as info:
        await load_model(url)
    message = str(info.value)
    assert "shared-credentials-file" in message and "profile weights-reader" in message
    assert "bad-secret-Pw27" not in message


async def test_explicit_profile_option(
    s3_env: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bucket = new_bucket()
    path = write_file(tmp_path / "m.safetensors", big_tensors(count=1))
    s3_env.upload(bucket, "", path)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = write_profile(tmp_path, "other", "AKIAOTHERPROFILE0000", "secret")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    got = await load_model(f"s3://{bucket}/m.safetensors", s3=S3Options(profile="other"))
    assert_matches_files(got, path)


async def test_anonymous_public_object(
    s3_env: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bucket = new_bucket()
    path = write_file(tmp_path / "m.safetensors", big_tensors(count=2))
    s3_env.create_bucket(bucket)
    s3_env.put_object(bucket, "pub/m.safetensors", path.read_bytes(), ACL="public-read")
    s3_env.put_object(bucket, "private/m.safetensors", path.read_bytes())
    # No credentials anywhere: unsigned requests are the only way in.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    anonymous = S3Options(anonymous=True)
    for url in (f"s3://{bucket}/pub/m.safetensors", f"s3://{bucket}/pub/"):
        assert_matches_files(await load_model(url, s3=anonymous), path)
    # With no credentials found at all, requests go out unsigned as well.
    assert_matches_files(await load_model(f"s3://{bucket}/pub/m.safetensors"), path)

    with pytest.raises(AccessDeniedError) as info:
        await load_model(f"s3://{bucket}/private/m.safetensors", s3=anonymous)
    assert "anonymous" in str(info.value) and f"s3://{bucket}/private/m.safetensors" in str(
        info.value
    )


async def test_endpoint_from_options_and_path_style(
    moto_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    moto_server.set_env(monkeypatch, tmp_path)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    bucket = new_bucket()
    path = write_file(tmp_path / "m.safetensors", big_tensors(count=1))
    moto_server.upload(bucket, "", path)
    # A custom endpoint means path-style addressing unless told otherwise: virtual-hosted
    # style would ask for the host {bucket}.127.0.0.1, which does not resolve.
    async with Loader(s3=S3Options(endpoint_url=moto_server.endpoint)) as loader:
        assert_matches_files(await loader.load(f"s3://{bucket}/m.safetensors"), path)
        assert loader.statistics().sources["s3"].maximum > 0


@pytest.mark.parametrize("how", ["env", "option"])
async def test_virtual_hosted_addressing_with_an_ip_endpoint(
    s3_env: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    """bucket.127.0.0.1 cannot exist: a clear error up front, not DNS failures retried."""
    bucket = new_bucket()
    path = write_file(tmp_path / "m.safetensors", big_tensors(count=1))
    s3_env.upload(bucket, "", path)
    url = f"s3://{bucket}/m.safetensors"
    s3 = None
    if how == "env":
        monkeypatch.setenv("AIOLOADER_S3_ADDRESSING", "virtual")
    else:
        s3 = S3Options(addressing="virtual")
    options = HttpOptions(max_attempts=2, backoff=0.01, backoff_max=0.05, connect_timeout=2)
    with pytest.raises(ConfigError) as info:
        await load_model(url, s3=s3, http=options)
    message = str(info.value)
    assert s3_env.endpoint in message and "virtual" in message
    assert "AIOLOADER_S3_ADDRESSING=path" in message

    # Without an option, AIOLOADER_S3_ADDRESSING is used.
    monkeypatch.setenv("AIOLOADER_S3_ADDRESSING", "path")
    assert_matches_files(await load_model(url), path)


# -- what is missing --------------------------------------------------------------------


async def test_missing_key(s3_env: MotoS3Server) -> None:
    bucket = new_bucket()
    s3_env.create_bucket(bucket)
    url = f"s3://{bucket}/no/such.safetensors"
    with pytest.raises(NotFoundError) as info:
        await load_model(url)
    assert url in str(info.value) and s3_env.endpoint in str(info.value)
    # Not a prefix either: the object is reported missing.
    with pytest.raises(NotFoundError) as info:
        await load_model(f"s3://{bucket}/no/such")
    assert f"s3://{bucket}/no/such" in str(info.value)


async def test_missing_bucket(s3_env: MotoS3Server) -> None:
    bucket = new_bucket()
    for url in (f"s3://{bucket}/m.safetensors", f"s3://{bucket}/prefix/"):
        with pytest.raises(NotFoundError) as info:
            await load_model(url)
        assert url in str(info.value) and "NoSuchBucket" in str(info.value)


async def test_prefix_without_safetensors(s3_env: MotoS3Server) -> None:
    bucket = new_bucket()
    s3_env.create_bucket(bucket)
    s3_env.put_object(bucket, "old/pytorch_model.bin", b"pickle")
    s3_env.put_object(bucket, "old/config.json", b"{}")
    with pytest.raises(SourceError) as info:
        await load_model(f"s3://{bucket}/old/")
    message = str(info.value)
    assert "no .safetensors files" in message and "pytorch_model.bin" in message
    with pytest.raises(SourceError) as info:
        await load_model(f"s3://{bucket}/empty/")
    assert "empty" in str(info.value)


# -- consistency and faults -------------------------------------------------------------


async def test_object_overwritten_mid_load(s3_env: MotoS3Server, tmp_path: Path) -> None:
    bucket = new_bucket()
    tensors = {f"t{i:02d}": torch.full((16 * 1024,), float(i)) for i in range(64)}  # 4 MiB
    path = write_file(tmp_path / "m.safetensors", tensors)
    s3_env.upload(bucket, "", path)
    changed = write_file(tmp_path / "changed.safetensors", {k: -t for k, t in tensors.items()})
    url = f"s3://{bucket}/m.safetensors"
    seen: dict[str, torch.Tensor] = {}
    async with Loader(concurrency=1, chunk_size="64KiB", memory_limit="1MiB") as loader:
        with pytest.raises(ObjectChangedError) as info:
            async with loader.stream(url) as stream:
                async for name, tensor in stream:
                    if not seen:
                        # Blocking on purpose: the load cannot move on meanwhile.
                        s3_env.put_object(bucket, "m.safetensors", changed.read_bytes())
                    seen[name] = tensor
        assert loader.statistics().budget.used == 0
    assert url in str(info.value)
    assert 0 < len(seen) < len(tensors)
    assert_same(seen, {n: tensors[n] for n in seen})  # only ever the first version


async def test_s3_retries_resume_and_are_signed(
    http_server: FaultyHttpServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An S3 endpoint that drops connections (the fault server, which ignores signatures)."""
    path = write_file(http_server.root / "bucket" / "m.safetensors", big_tensors(count=8))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAULTY0000000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "faulty-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    key = "bucket/m.safetensors"
    http_server.stall(key, 0.0)  # the probe
    http_server.reset_after(key, 12_345)
    http_server.status(key, 503, retry_after=0)
    got = await load_model(
        "s3://bucket/m.safetensors",
        concurrency=1,
        chunk_size="1MiB",
        http=FAST,
        s3=S3Options(endpoint_url=http_server.url),
    )
    assert_matches_files(got, path)
    gets = http_server.gets(key)
    ranges = [r.range for r in gets]
    assert ranges[0] == f"bytes=0-{PROBE_SIZE - 1}"
    first, last = (int(x) for x in ranges[1].removeprefix("bytes=").split("-"))  # type: ignore[union-attr]
    assert ranges[2] == ranges[3] == f"bytes={first + 12_345}-{last}"
    # Every attempt is signed anew, its Range header included in the signature (and
    # the HEAD that asks for the object's checksum signed too).
    for record, headers in zip(http_server.requests, http_server.request_headers, strict=True):
        auth = headers["Authorization"]
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIAFAULTY0000000000/")
        signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
        assert ("range" if record.method == "GET" else "x-amz-checksum-mode") in signed
        assert "X-Amz-Date" in headers and "X-Amz-Content-SHA256" in headers


async def test_s3_gives_up_with_byte_range(
    http_server: FaultyHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_file(http_server.root / "bucket" / "m.safetensors", big_tensors(count=2))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAULTY0000000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "faulty-secret")
    http_server.status("bucket/m.safetensors", 500, count=100)
    with pytest.raises(ReadError) as info:
        await load_model(
            "s3://bucket/m.safetensors",
            http=HttpOptions(max_attempts=2, backoff=0.01, backoff_max=0.05),
            s3=S3Options(endpoint_url=http_server.url),
        )
    assert "s3://bucket/m.safetensors" in str(info.value)
    assert f"[0, {PROBE_SIZE})" in str(info.value)


async def test_awkward_keys_signed_and_paged(
    moto_auth_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Keys that need percent-encoding, listed over two pages, with signatures checked."""
    server = moto_auth_server
    server.set_env(monkeypatch, tmp_path)
    bucket = new_bucket()
    folder = tmp_path / "odd"
    a = write_file(folder / "weights v1+ü=(a)&.safetensors", big_tensors(count=1, seed=3))
    b = write_file(folder / "zz~b.safetensors", {"x": torch.arange(7)})
    server.upload(bucket, "my models/ä+b", folder)
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for i in range(1001):
        backend.put_object(bucket, f"my models/ä+b/log {i:04d}.txt", b"x")
    got = await load_model(f"s3://{bucket}/my models/ä+b/")
    assert_matches_files(got, a, b)


@pytest.mark.parametrize("algorithm", ["SHA256", "CRC32", "SHA1"])
async def test_fetch_checks_the_checksum_s3_publishes(
    s3_env: MotoS3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture, algorithm: str
) -> None:
    """An object uploaded with a checksum: the cache's download is checked against it."""
    from aioloader import ModelCache

    bucket = new_bucket()
    path = write_file(tmp_path / "model.safetensors", big_tensors())
    client = s3_env.client()
    client.create_bucket(Bucket=bucket)
    client.put_object(
        Bucket=bucket, Key="m/model.safetensors", Body=path.read_bytes(),
        ChecksumAlgorithm=algorithm,
    )  # fmt: skip
    url = f"s3://{bucket}/m/model.safetensors"
    caplog.set_level("INFO", logger="aioloader")
    model = await ModelCache(tmp_path / "cache").fetch(url)
    assert isinstance(model.path, str)
    assert_matches_files(await load_model(model.path), path)
    assert (
        f"matches the {algorithm.lower()} of the server's x-amz-checksum-{algorithm.lower()}"
        in (caplog.text)
    )


async def test_sse_kms_etags_are_not_taken_for_md5s(s3_env: MotoS3Server, tmp_path: Path) -> None:
    """Under SSE-KMS an S3 ETag has 32 hex digits but is not the MD5 of the bytes: a
    fetch must not refuse the download for it."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    from aioloader import ModelCache

    bucket = new_bucket()
    path = write_file(tmp_path / "model.safetensors", big_tensors())
    client = s3_env.client()
    client.create_bucket(Bucket=bucket)
    client.put_object(
        Bucket=bucket, Key="m/model.safetensors", Body=path.read_bytes(),
        ServerSideEncryption="aws:kms", SSEKMSKeyId="alias/models",
    )  # fmt: skip
    key = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, "m/model.safetensors")
    key._etag = "0123456789abcdef0123456789abcdef"  # as S3 computes it under KMS: no MD5
    key.checksum_algorithm = key.checksum_value = None  # uploaded without a checksum
    model = await ModelCache(tmp_path / "cache").fetch(f"s3://{bucket}/m/model.safetensors")
    assert isinstance(model.path, str)
    assert_matches_files(await load_model(model.path), path)
