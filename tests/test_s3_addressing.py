"""An explicit S3 addressing style beats ``AIOLOADER_S3_ADDRESSING``, against a real S3
server (moto's), tensors compared with the files."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioloader import Loader, S3Options, load_model

from .helpers import assert_matches_files, write_file
from .servers import MotoS3Server
from .test_s3 import big_tensors, new_bucket


@pytest.mark.parametrize("how", ["keyword", "object"])
async def test_an_explicit_addressing_wins_over_the_environment(
    s3_env: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    """An explicit setting beats its variable: AIOLOADER_S3_ADDRESSING=virtual once
    overrode s3_addressing="path", and a load from an IP endpoint failed (bucket.127.0.0.1)."""
    bucket = new_bucket()
    path = write_file(tmp_path / "m.safetensors", big_tensors(count=1))
    s3_env.upload(bucket, "", path)
    url = f"s3://{bucket}/m.safetensors"
    monkeypatch.setenv("AIOLOADER_S3_ADDRESSING", "virtual")
    given = {"s3_addressing": "path"} if how == "keyword" else {"s3": S3Options(addressing="path")}
    assert_matches_files(await load_model(url, **given), path)  # type: ignore[arg-type]
    async with Loader(**given) as loader:  # type: ignore[arg-type]
        assert_matches_files(await loader.load(url), path)
        assert loader.statistics().sources["s3"].maximum > 0
