"""``gs://`` objects checked against the checksums Cloud Storage publishes for them.

Every object has a ``crc32c``; one uploaded in one piece has an ``md5Hash`` too, a
composed one (``compose``, parallel composite uploads) has none. A load checks the
crc32c where there is one (with google-crc32c), else the md5Hash, else nothing; it
never needs the MD5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aioloader import DigestMismatchError, load_model

from .helpers import assert_matches_files, write_file
from .servers import GcsEmulator

pytest.importorskip("gcp_storage_emulator")


def _model(tmp_path: Path, seed: int) -> tuple[Path, bytes]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {"w": torch.randn(300_000, generator=gen), "b": torch.arange(99).to(torch.int16)}
    path = write_file(tmp_path / f"model-{seed}.safetensors", tensors)
    return path, path.read_bytes()


def _bucket(gcs: GcsEmulator, name: str) -> str:
    gcs.create_bucket(name)
    return name


async def test_a_composed_object_has_only_a_crc32c_which_is_checked(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    path, data = _model(tmp_path, 1)
    bucket = _bucket(gcs, "composed")
    third = len(data) // 3
    pieces = [data[:third], data[third : 2 * third], data[2 * third :]]
    for i, piece in enumerate(pieces):
        gcs.put(bucket, f"tmp/{i}", piece)
    gcs.compose(bucket, "m/model.safetensors", [f"tmp/{i}" for i in range(3)])
    stored = gcs.stored(bucket, "m/model.safetensors")
    assert "md5Hash" not in stored and stored["crc32c"]
    url = f"gs://{bucket}/m/model.safetensors"
    assert_matches_files(await load_model(url, chunk_size="256KiB"), path)

    gcs.change_byte(bucket, "m/model.safetensors", third + 5)
    with pytest.raises(DigestMismatchError) as info:
        await load_model(url, chunk_size="256KiB")
    error = info.value
    assert error.url == url and error.algorithm == "crc32c" and error.expected == stored["crc32c"]
    assert "crc32c" in str(error)


async def test_a_simple_upload_is_checked_and_the_md5_serves_where_the_crc32c_is_not_given(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    path, data = _model(tmp_path, 2)
    bucket = _bucket(gcs, "simple")
    gcs.put(bucket, "m/model.safetensors", data)
    url = f"gs://{bucket}/m/model.safetensors"
    assert_matches_files(await load_model(url), path)
    stored = gcs.stored(bucket, "m/model.safetensors")
    md5 = stored["md5Hash"]
    del stored["crc32c"]
    assert_matches_files(await load_model(url), path)
    gcs.change_byte(bucket, "m/model.safetensors", len(data) - 1)
    with pytest.raises(DigestMismatchError) as info:
        await load_model(url)
    assert info.value.algorithm == "md5" and info.value.expected == md5


async def test_an_object_without_checksums_loads_unchecked(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    path, data = _model(tmp_path, 3)
    bucket = _bucket(gcs, "bare")
    gcs.put(bucket, "m/model.safetensors", data)
    stored = gcs.stored(bucket, "m/model.safetensors")
    del stored["crc32c"], stored["md5Hash"]
    assert_matches_files(await load_model(f"gs://{bucket}/m/model.safetensors"), path)


async def test_a_wrong_crc32c_is_refused(gcs: GcsEmulator, tmp_path: Path) -> None:
    _, data = _model(tmp_path, 4)
    bucket = _bucket(gcs, "lying")
    gcs.put(bucket, "m/model.safetensors", data)
    gcs.stored(bucket, "m/model.safetensors")["crc32c"] = "AAAAAA=="
    with pytest.raises(DigestMismatchError, match="AAAAAA=="):
        await load_model(f"gs://{bucket}/m/model.safetensors")
