"""``--model-loader-extra-config`` checking, without vLLM (aioloader.vllm imports it lazily)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioloader import ConfigError, HttpOptions, S3Options
from aioloader.vllm import KEYS, VllmOptions, weights_url


def test_every_key_becomes_a_loader_setting() -> None:
    options = VllmOptions.parse(
        {
            "url": "s3://bucket/llama/",
            "concurrency": 32,
            "chunk_size": "8MiB",
            "memory_limit": 1 << 30,
            "cache_dir": "/var/cache/aioloader",
            "headers": {"Authorization": "Bearer x"},
            "max_attempts": 3,
            "stall_timeout": 5,
            "connect_timeout": 2.5,
            "s3_endpoint_url": "http://minio:9000",
            "s3_region": "eu-west-1",
            "s3_addressing": "path",
            "s3_anonymous": False,
            "s3_profile": "serving",
            "distributed": True,
        }
    )
    assert options.distributed
    assert options.url == "s3://bucket/llama/"
    limits = options.loader.limits
    assert limits is not None and limits.concurrency == 32 and limits.chunk_size == 8 << 20
    assert options.loader.cache_dir == "/var/cache/aioloader"
    http = options.loader.http
    assert isinstance(http, HttpOptions)
    assert http.headers == (("Authorization", "Bearer x"),) and http.max_attempts == 3
    assert options.loader.s3 == S3Options(
        endpoint_url="http://minio:9000", region="eu-west-1", addressing="path",
        anonymous=False, profile="serving",
    )  # fmt: skip


def test_no_keys_means_no_cache_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOLOADER_CACHE_DIR", raising=False)
    options = VllmOptions.parse(None)
    assert options.url is None and options.loader.cache_dir is False
    monkeypatch.setenv("AIOLOADER_CACHE_DIR", "/var/cache/aioloader")  # asked by the node
    assert VllmOptions.parse(None).loader.cache_dir == "/var/cache/aioloader"


def test_the_keys_are_the_load_options() -> None:
    """One list of options: vLLM's keys are the load's keywords, less where tensors go."""
    from aioloader.options import KEYWORDS

    assert set(KEYS) == {k.name for k in KEYWORDS} - {"device", "framework"} | {
        "url",
        "distributed",
    }


def test_an_unknown_key_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        VllmOptions.parse({"concurency": 4})
    message = str(info.value)
    assert "unknown key 'concurency' (did you mean 'concurrency'?)" in message
    assert all(key in message for key in KEYS)


@pytest.mark.parametrize(
    ("key", "value"),
    [("concurrency", "16"), ("concurrency", True), ("s3_anonymous", "yes"), ("headers", [])],
)
def test_a_value_of_the_wrong_type_is_named(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"'{key}' must be"):
        VllmOptions.parse({key: value})


def test_a_bad_s3_addressing_fails_early() -> None:
    with pytest.raises(ConfigError):
        VllmOptions.parse({"s3_addressing": "sideways"})


@pytest.mark.parametrize(
    ("model", "revision", "url"),
    [
        ("org/name", None, "hf://org/name@main"),
        ("org/name", "v1.0", "hf://org/name@v1.0"),
        ("org/name", "feature/x", "hf://org/name@feature%2Fx"),
        ("hf://org/name@dev", None, "hf://org/name@dev"),
        ("s3://bucket/prefix/", None, "s3://bucket/prefix/"),
        ("gs://bucket/prefix", None, "gs://bucket/prefix"),
        ("az://container/prefix", "main", "az://container/prefix"),
        ("gpt2", None, "gpt2"),  # no owner: not an hf:// repository, kept to fail as a path
        ("org/name/sub", None, "org/name/sub"),
        ("org/na--me", None, "org/na--me"),
    ],
)
def test_the_weights_url_of_a_model(model: str, revision: str | None, url: str) -> None:
    assert weights_url(model, revision) == url


def test_an_existing_folder_is_read_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert weights_url("org/name") == "org/name"
