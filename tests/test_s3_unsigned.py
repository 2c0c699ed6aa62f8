"""s3:// without credentials says once, per process, that its requests go unsigned."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import aioloader
from aioloader.sources.s3 import signer

from .helpers import assert_same, random_tensors, write_file
from .s3_server import MotoS3Server


def _no_credentials(monkeypatch: pytest.MonkeyPatch, server: MotoS3Server, tmp: Path) -> None:
    server.set_env(monkeypatch, tmp)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setattr(signer, "_warned_unsigned", False)


def _public_model(server: MotoS3Server, bucket: str, tmp: Path) -> tuple[str, dict[str, Any]]:
    """A public object in a new bucket: its URL and tensors."""
    tensors = random_tensors(count=3)
    server.create_bucket(bucket)
    path = write_file(tmp / "m.safetensors", tensors)
    server.put_object(bucket, "m.safetensors", path.read_bytes(), ACL="public-read")
    return f"s3://{bucket}/m.safetensors", tensors


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "go unsigned" in r.getMessage()]


async def test_unsigned_requests_are_named_once(
    moto_server: MotoS3Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _no_credentials(monkeypatch, moto_server, tmp_path)
    url, tensors = _public_model(moto_server, "unsigned-warning", tmp_path)
    caplog.set_level(logging.WARNING)
    for _ in range(2):  # two loads, two sources: one warning
        assert_same(await aioloader.load_model(url, cache_dir=False), tensors)
    (message,) = _warnings(caplog)
    assert "no AWS credentials were found" in message and moto_server.endpoint in message
    assert "AWS_ACCESS_KEY_ID" in message and "s3_anonymous=True" in message


async def test_anonymous_or_signed_says_nothing(
    moto_server: MotoS3Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _no_credentials(monkeypatch, moto_server, tmp_path)
    url, tensors = _public_model(moto_server, "unsigned-quiet", tmp_path)
    caplog.set_level(logging.WARNING)
    assert_same(await aioloader.load_model(url, s3_anonymous=True, cache_dir=False), tensors)
    moto_server.set_env(monkeypatch, tmp_path)  # credentials again
    assert_same(await aioloader.load_model(url, cache_dir=False), tensors)
    assert _warnings(caplog) == []
