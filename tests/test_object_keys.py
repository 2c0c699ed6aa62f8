"""``s3://`` and ``gs://`` keys holding ``#`` or ``?`` are keys, not a fragment or a query.

``urlsplit("s3://bucket/dir#x/model.safetensors")`` gives the path ``/dir``: a load
read the object ``dir``, another file (here a decoy that must never load). As the AWS
CLI and gcloud take them, everything after ``<bucket>/`` is the key, as written.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from aioloader import ConfigError, ModelCache, load_model
from aioloader.sources.gcs.url import split_gs_url
from aioloader.sources.s3.url import split_s3_url

from .helpers import assert_matches_files, write_file
from .servers import GcsEmulator, MotoS3Server

KEYS = ["dir#x/model.safetensors", "a?b=1.safetensors", "q?/r#s?t.safetensors", "x#"]
DECOYS = ["dir", "a", "q", "x"]  # what urlsplit's path would name


def _files(tmp_path: Path) -> tuple[Path, Path]:
    real = write_file(tmp_path / "real.safetensors", {"real": torch.arange(1000.0)})
    decoy = write_file(tmp_path / "decoy.safetensors", {"decoy": torch.zeros(10)})
    return real, decoy


def test_the_key_is_everything_after_the_bucket() -> None:
    for key in KEYS:
        assert split_s3_url(f"s3://bucket/{key}") == ("bucket", key)
        assert split_gs_url(f"gs://bucket/{key}") == ("bucket", key)
    assert split_s3_url("s3://bucket") == ("bucket", "")
    assert split_s3_url("s3://bucket/") == ("bucket", "")
    assert split_s3_url("S3://bucket/k%23") == ("bucket", "k%23")  # no decoding: as written
    for bad in ("s3://bu#cket/k", "s3://bucket?x/k", "s3:///k", "s3://#/k"):
        with pytest.raises(ConfigError, match="bucket"):
            split_s3_url(bad)
    with pytest.raises(ConfigError, match="gs://bucket/object"):
        split_gs_url("gs://b?c/k")


async def test_s3_keys_with_a_hash_or_a_question_mark(s3_env: MotoS3Server, tmp_path: Path) -> None:
    real, decoy = _files(tmp_path)
    bucket = f"keys-{uuid.uuid4().hex[:12]}"
    s3_env.create_bucket(bucket)
    for key, trap in zip(KEYS, DECOYS, strict=True):
        s3_env.put_object(bucket, key, real.read_bytes())
        s3_env.put_object(bucket, trap, decoy.read_bytes())
    for key in KEYS:
        assert_matches_files(await load_model(f"s3://{bucket}/{key}"), real)
    # A prefix holding "#": listed and loaded (the decoy "dir" is beside it, not in it).
    assert_matches_files(await load_model(f"s3://{bucket}/dir#x/"), real)
    model = await ModelCache(tmp_path / "cache").fetch(f"s3://{bucket}/dir#x/model.safetensors")
    assert isinstance(model.path, str)
    assert_matches_files(await load_model(model.path), real)


@pytest.fixture(scope="module")
def emulator() -> Iterator[GcsEmulator]:
    pytest.importorskip("gcp_storage_emulator")
    with GcsEmulator() as server:
        yield server


async def test_gs_keys_with_a_hash_or_a_question_mark(
    emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.endpoint)
    real, decoy = _files(tmp_path)
    bucket = f"keys-{uuid.uuid4().hex[:12]}"
    with contextlib.suppress(Exception):
        emulator.create_bucket(bucket)
    for key, trap in zip(KEYS, DECOYS, strict=True):
        emulator.put(bucket, key, real.read_bytes())
        emulator.put(bucket, trap, decoy.read_bytes())
    for key in KEYS:
        assert_matches_files(await load_model(f"gs://{bucket}/{key}"), real)
    assert_matches_files(await load_model(f"gs://{bucket}/dir#x/"), real)
