"""Objects uploaded in parts, as boto3's ``upload_file`` makes them above 8 MiB.

Such an object's checksum is COMPOSITE by default: a checksum of its parts' checksums,
not of its bytes. What moto 5.2 answers, found by experiment (boto3 1.44, 17 MiB file,
parts of 8 MiB):

* HEAD in checksum mode: ``x-amz-checksum-<algorithm>`` with the composite value and
  no ``-<parts>`` suffix, no ``x-amz-checksum-type``; the ETag ends in ``-3``. (Real S3
  answers ``<value>-3`` and ``x-amz-checksum-type: COMPOSITE``.)
* HEAD ``?partNumber=N``: the part's Content-Length and ``x-amz-mp-parts-count``, no
  checksum.
* A FULL_OBJECT multipart upload: ``x-amz-checksum-type: FULL_OBJECT`` and the
  checksum of the whole object.

A load checks a composite checksum part by part (each part's checksum over its byte
range, then the checksum of those) and refuses a changed byte; nothing of a correct
object is refused.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from aioloader import DigestMismatchError, S3Options, load_model

from .helpers import assert_matches_files, write_file
from .s3_server import MotoS3Server

PART = 8 << 20  # boto3's multipart_chunksize and multipart_threshold


def _crt() -> bool:
    try:
        import awscrt  # noqa: F401
    except ImportError:
        return False
    return True


def _crc32c_in_moto() -> bool:
    """moto computes a CRC32C with the ``crc32c`` package, and a CRC32 in its place
    without it: a checksum no store would publish."""
    try:
        import crc32c  # noqa: F401
    except ImportError:
        return False
    return True


def _algorithms() -> list[Any]:
    needs_crt = pytest.mark.skipif(not _crt(), reason="boto3 computes it only with awscrt")
    moto_crc32c = pytest.mark.skipif(
        not _crc32c_in_moto(), reason="moto computes a CRC32C only with the crc32c package"
    )
    return [
        None,  # boto3's default: CRC32 since 2025 (request_checksum_calculation=when_supported)
        "CRC32",
        "SHA1",
        "SHA256",
        pytest.param("CRC32C", marks=[needs_crt, moto_crc32c]),
        pytest.param("CRC64NVME", marks=needs_crt),  # FULL_OBJECT only, in parts too
    ]


@contextlib.contextmanager
def _boto3(server: MotoS3Server) -> Iterator[Any]:
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "s3",
        region_name=server.REGION,
        endpoint_url=server.endpoint,
        aws_access_key_id=server.credentials[0],
        aws_secret_access_key=server.credentials[1],
        config=Config(s3={"addressing_style": "path"}),
    )
    try:
        yield client
    finally:
        client.close()


def _model(tmp_path: Path, seed: int = 5, size: int = 2 * PART + (1 << 20)) -> Path:
    """A safetensors file of about ``size`` bytes: three parts of an upload_file."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        "embed": torch.randn(size // 6, generator=gen),
        "head": torch.randn(size // 6, generator=gen).to(torch.float16),
        "norm": torch.arange(777, dtype=torch.int64),
    }
    return write_file(tmp_path / "model.safetensors", tensors)


def _upload_file(server: MotoS3Server, path: Path, algorithm: str | None, **extra: Any) -> str:
    bucket = f"mp-{uuid.uuid4().hex[:16]}"
    args = dict(extra)
    if algorithm is not None:
        args["ChecksumAlgorithm"] = algorithm
    with _boto3(server) as s3:
        s3.create_bucket(Bucket=bucket)
        s3.upload_file(str(path), bucket, "m/model.safetensors", ExtraArgs=args or None)
    return f"s3://{bucket}/m/model.safetensors"


def _stored(url: str) -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    bucket, key = url.removeprefix("s3://").split("/", 1)
    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, key)


def _flip(url: str, at: int) -> None:
    """Change one stored byte; the checksums the object was uploaded with stay."""
    stored = _stored(url)
    bad = bytearray(stored.value)
    bad[at] ^= 0xFF
    stored.value = bytes(bad)


def _options(server: MotoS3Server) -> dict[str, Any]:
    return {"s3": S3Options(endpoint_url=server.endpoint), "chunk_size": "1MiB"}


@pytest.mark.parametrize("algorithm", _algorithms())
async def test_upload_file_in_parts_loads_and_a_changed_byte_is_refused(
    s3_env: MotoS3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture, algorithm: Any
) -> None:
    path = _model(tmp_path)
    url = _upload_file(s3_env, path, algorithm)
    stored = _stored(url)
    # S3 has no composite CRC64NVME: in parts too, it is of the whole object.
    kind, said = ("COMPOSITE", "over its 3 parts")
    if algorithm == "CRC64NVME":
        kind, said = ("FULL_OBJECT", "(x-amz-checksum-crc64nvme)")
    assert stored.checksum_type == kind and stored.multipart is not None
    caplog.set_level(logging.DEBUG, logger="aioloader")
    assert_matches_files(await load_model(url, **_options(s3_env)), path)
    assert f"matches the {(algorithm or 'crc32').lower()} S3 publishes" in caplog.text
    assert said in caplog.text  # checked, not read unchecked

    for at in (4096, PART + 7, path.stat().st_size - 3):  # in the first, a middle, the last part
        _flip(url, at)
        with pytest.raises(DigestMismatchError) as info:
            await load_model(url, **_options(s3_env))
        assert info.value.url == url and said in str(info.value)
        _flip(url, at)
    assert_matches_files(await load_model(url, **_options(s3_env)), path)


async def test_a_full_object_checksum_of_a_multipart_upload_is_checked_whole(
    s3_env: MotoS3Server, tmp_path: Path
) -> None:
    path = _model(tmp_path, seed=6)
    whole = base64.b64encode(zlib.crc32(path.read_bytes()).to_bytes(4, "big")).decode()
    url = _upload_file(s3_env, path, None, ChecksumCRC32=whole)  # FULL_OBJECT, in parts
    stored = _stored(url)
    assert stored.checksum_type == "FULL_OBJECT" and stored.multipart is not None
    assert_matches_files(await load_model(url, **_options(s3_env)), path)
    _flip(url, PART + 1)
    with pytest.raises(DigestMismatchError) as info:
        await load_model(url, **_options(s3_env))
    assert info.value.expected == whole


async def test_a_store_that_does_not_say_full_object_is_still_read_right(
    s3_env: MotoS3Server, tmp_path: Path
) -> None:
    """A multipart object with a full-object CRC, the store silent about its type (no
    ``x-amz-checksum-type``, ETag ``-3``): either reading is accepted, a changed byte
    matches neither."""
    path = _model(tmp_path, seed=7)
    whole = base64.b64encode(zlib.crc32(path.read_bytes()).to_bytes(4, "big")).decode()
    url = _upload_file(s3_env, path, None, ChecksumCRC32=whole)
    _stored(url).metadata.pop("x-amz-checksum-type")
    assert_matches_files(await load_model(url, **_options(s3_env)), path)
    _flip(url, 4096)
    with pytest.raises(DigestMismatchError):
        await load_model(url, **_options(s3_env))


async def test_a_wrong_composite_value_is_refused(s3_env: MotoS3Server, tmp_path: Path) -> None:
    path = _model(tmp_path, seed=8)
    url = _upload_file(s3_env, path, "SHA256")
    _stored(url).checksum_value = base64.b64encode(bytes(32)).decode()
    with pytest.raises(DigestMismatchError) as info:
        await load_model(url, **_options(s3_env))
    assert "x-amz-checksum-sha256" in str(info.value)


@pytest.mark.parametrize("etag_parts", [5, 0])
async def test_a_part_count_that_disagrees_is_read_unchecked_and_said(
    s3_env: MotoS3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture, etag_parts: int
) -> None:
    """The ETag says 5 parts (or 0), the parts say 3: the layout of the composite checksum
    is unknown, so the object loads unchecked, and a warning says so."""
    path = _model(tmp_path, seed=9)
    url = _upload_file(s3_env, path, "CRC32")
    stored = _stored(url)
    stored._etag = stored.etag.strip('"').split("-")[0] + f"-{etag_parts}"
    caplog.set_level(logging.WARNING, logger="aioloader")
    assert_matches_files(await load_model(url, **_options(s3_env)), path)
    assert "unchecked" in caplog.text and url in caplog.text


async def test_a_model_cache_fetch_of_a_multipart_upload(
    s3_env: MotoS3Server, tmp_path: Path
) -> None:
    from aioloader import ModelCache

    path = _model(tmp_path, seed=10)
    url = _upload_file(s3_env, path, None)
    model = await ModelCache(tmp_path / "cache").fetch(url)
    assert isinstance(model.path, str)
    assert_matches_files(await load_model(model.path), path)


async def test_a_put_object_is_still_checked_whole(s3_env: MotoS3Server, tmp_path: Path) -> None:
    path = _model(tmp_path, seed=11, size=1 << 20)
    bucket = f"mp-{uuid.uuid4().hex[:16]}"
    with _boto3(s3_env) as s3:
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="m/model.safetensors", Body=path.read_bytes())
    url = f"s3://{bucket}/m/model.safetensors"
    assert_matches_files(await load_model(url, **_options(s3_env)), path)
    _flip(url, 4096)
    with pytest.raises(DigestMismatchError):
        await load_model(url, **_options(s3_env))


async def test_a_folder_copy_with_an_empty_object_uploaded_in_one_empty_part(
    s3_env: MotoS3Server, tmp_path: Path
) -> None:
    """``aioloader fetch``'s folder copy: the model (composite, in parts) is checked, and an
    empty object uploaded as one empty part (no part size to check against) is copied
    as it is."""
    from aioloader.fetch.copy import copy_folder

    path = _model(tmp_path, seed=12)
    url = _upload_file(s3_env, path, "SHA1")
    bucket = url.removeprefix("s3://").split("/")[0]
    with _boto3(s3_env) as s3:
        upload = s3.create_multipart_upload(
            Bucket=bucket, Key="m/empty.txt", ChecksumAlgorithm="CRC32"
        )["UploadId"]
        part = s3.upload_part(
            Bucket=bucket, Key="m/empty.txt", UploadId=upload, PartNumber=1, Body=b"",
            ChecksumAlgorithm="CRC32",
        )  # fmt: skip
        s3.complete_multipart_upload(
            Bucket=bucket, Key="m/empty.txt", UploadId=upload,
            MultipartUpload={"Parts": [
                {"PartNumber": 1, "ETag": part["ETag"], "ChecksumCRC32": part["ChecksumCRC32"]}
            ]},
        )  # fmt: skip
    dest = tmp_path / "dest"
    await copy_folder(f"s3://{bucket}/m/", dest)
    assert (dest / "empty.txt").read_bytes() == b""
    assert_matches_files(await load_model(str(dest / "model.safetensors")), path)
    _flip(url, 4096)
    with pytest.raises(DigestMismatchError):
        await copy_folder(f"s3://{bucket}/m/", tmp_path / "dest2")


async def test_a_store_whose_parts_cannot_be_asked_for_reads_unchecked(
    s3_env: MotoS3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``HEAD ?partNumber=1`` answers the whole object and part 2 is refused (416), as
    where a store keeps no parts: the layout is unknown, the object loads unchecked."""
    path = _model(tmp_path, seed=13)
    url = _upload_file(s3_env, path, "SHA256")
    _stored(url).multipart = None  # the ETag still says -3, the checksum is composite
    caplog.set_level(logging.WARNING, logger="aioloader")
    assert_matches_files(await load_model(url, **_options(s3_env)), path)
    assert f"{url}: read unchecked" in caplog.text and "parts could not be asked" in caplog.text


@pytest.mark.parametrize("said", ["COMPOSITE", "PARTIAL"])
async def test_a_single_part_object_said_to_be_composite_reads_unchecked(
    s3_env: MotoS3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture, said: str
) -> None:
    """A store that says COMPOSITE (or a type S3 does not have) of an object uploaded in
    one piece, with no part count anywhere: its checksum cannot be read either way."""
    path = _model(tmp_path, seed=14, size=1 << 20)
    bucket = f"mp-{uuid.uuid4().hex[:16]}"
    with _boto3(s3_env) as s3:
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="m/model.safetensors", Body=path.read_bytes())
    url = f"s3://{bucket}/m/model.safetensors"
    _stored(url).metadata["x-amz-checksum-type"] = said
    caplog.set_level(logging.WARNING, logger="aioloader")
    assert_matches_files(await load_model(url, **_options(s3_env)), path)
    assert f"{url}: read unchecked" in caplog.text and said in caplog.text
