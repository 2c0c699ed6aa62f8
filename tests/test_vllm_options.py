"""``--model-loader-extra-config`` checking, without vLLM (aioloader.vllm imports it lazily)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioloader import ConfigError, HttpOptions, Loader, S3Options
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
    from aioloader.settings.options import KEYWORDS

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
    ("key", "value", "words"),
    [
        ("cache_dir", "", "cache_dir must name a folder"),
        ("cache_dir", "   ", "cache_dir must name a folder"),
        ("url", "", "'url' is empty"),
        ("connect_timeout", 0, "connect_timeout must be positive"),
        ("stall_timeout", 0.0, "stall_timeout must be positive"),
        ("headers", {"Authorization": "Bearer x\n"}, "line break"),
        ("headers", {"Bad Name": "x"}, "is not a header name"),
        ("headers", {"X-Token": "\u20ac"}, "beyond Latin-1"),
        ("s3_endpoint_url", "", "http:// or https://"),
        ("s3_endpoint_url", "minio:9000", "http:// or https://"),
        ("chunk_size", "16mb", "ambiguous"),
    ],
)  # fmt: skip
def test_what_a_load_would_refuse_is_refused_at_parse(key: str, value: object, words: str) -> None:
    """Such values passed parsing and failed only when vLLM built the loader or loaded,
    after the engine had started (cache_dir "": "the cache folder must be a non-empty
    path" from the Loader; a header with a newline: aiohttp's raw ValueError at the
    first request)."""
    with pytest.raises(ConfigError, match=f"^--model-loader-extra-config: '{key}'") as info:
        VllmOptions.parse({key: value})
    assert words in str(info.value)
    assert "Bearer" not in str(info.value)  # a header's value is never shown


async def test_what_parse_accepts_a_loader_takes(tmp_path: Path) -> None:
    options = VllmOptions.parse(
        {
            "cache_dir": str(tmp_path / "cache"), "headers": {"X-Tab": "a\tb", "X-L": "caf\u00e9"},
            "connect_timeout": 0.5, "s3_endpoint_url": "http://127.0.0.1:9",
            "chunk_size": "64KiB", "url": "s3://bucket/m/",
        }
    )  # fmt: skip
    async with Loader(options.loader) as loader:
        assert loader.options.cache_dir == str(tmp_path / "cache")


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
