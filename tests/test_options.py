"""One settings value: ``LoadOptions`` from keywords, settings objects, the environment and
defaults, in that order; every surface (Loader, load_model, fetch, the CLI, vLLM, Ray)
takes the same keywords from one table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import pytest

from aioloader import ConfigError, HttpOptions, Limits, Loader, ModelCache, load_model
from aioloader.settings.options import KEYWORDS, LoadKeywords, LoadOptions

from .helpers import assert_matches_files, random_tensors, write_file


def test_the_typed_keywords_are_the_table() -> None:
    typed = set(get_type_hints(LoadKeywords))
    assert typed == {k.name for k in KEYWORDS} | {"limits", "http", "s3", "group"}


def test_keywords_win_over_objects_the_environment_and_defaults() -> None:
    env = {
        "AIOLOADER_CONCURRENCY": "3",
        "AIOLOADER_STALL_TIMEOUT": "7",
        "AIOLOADER_CHUNK_SIZE": "1MiB",
    }
    built = LoadOptions.build(environ=env)
    assert built.limits is not None and built.limits.concurrency == 3
    assert built.limits.chunk_size == 1 << 20
    assert built.http is not None and built.http.stall_timeout == 7
    # A keyword beats the environment.
    assert LoadOptions.build(environ=env, concurrency=5).limits.concurrency == 5  # type: ignore[union-attr]
    # A settings object given is explicit for its fields: the environment stays out of it.
    built = LoadOptions.build(environ=env, limits=Limits(concurrency=9))
    assert built.limits == Limits(concurrency=9)
    built = LoadOptions.build(environ=env, http=HttpOptions(max_attempts=2), max_attempts=4)
    assert (
        built.http is not None and built.http.max_attempts == 4 and built.http.stall_timeout == 30
    )
    # Nothing set: the defaults, and no cache.
    assert LoadOptions.build(environ={}) == LoadOptions.build(environ={}, cache_dir=False)
    assert LoadOptions.build(environ={}).cache_dir is False


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AIOLOADER_CONCURRENCY", "many"),
        ("AIOLOADER_CONCURRENCY", ""),
        ("AIOLOADER_CONCURRENCY", "0"),
        ("AIOLOADER_CONCURRENCY", "99999999999999999999"),
        ("AIOLOADER_STALL_TIMEOUT", "nan"),
        ("AIOLOADER_STALL_TIMEOUT", "inf"),
        ("AIOLOADER_STALL_TIMEOUT", "-1"),
        ("AIOLOADER_CHUNK_SIZE", "16 furlongs"),
        ("AIOLOADER_MEMORY_LIMIT", "1" + "0" * 400),
        ("AIOLOADER_MAX_ATTEMPTS", "1.5"),
    ],
)
def test_a_bad_environment_value_names_its_variable(variable: str, value: str) -> None:
    name = variable[len("AIOLOADER_") :].lower()
    with pytest.raises(ConfigError) as info:
        LoadOptions.build(environ={variable: value})
    assert variable in str(info.value) or name in str(info.value)


@pytest.mark.parametrize(
    "given",
    [
        {"concurrency": "16"},
        {"concurrency": True},
        {"concurrency": 1.5},
        {"headers": [("a", "b")]},
        {"s3_anonymous": "yes"},
        {"stall_timeout": float("nan")},
        {"deadline": 0},
        {"limits": {"concurrency": 2}},
        {"http": "fast"},
        {"cache_dir": 5},
        {"cache_dir": ""},
        {"chunk_size": ""},
        {"memory_limit": "9" * 50},
        {"headers": {"X-Token": "secret\r\nInjected: 1"}},
        {"headers": {"No Space": "x"}},
        {"s3_endpoint_url": "minio:9000"},
        {"cache_dir": "  "},
    ],
)
def test_wrong_values_are_refused_naming_the_option(given: dict[str, object]) -> None:
    name = next(iter(given))
    with pytest.raises(ConfigError, match=name.split("_")[0]):
        LoadOptions.build(environ={}, **given)
        Loader(**given)  # type: ignore[arg-type]  # cache_dir="" is refused by the cache


def test_an_unknown_option_is_named_with_the_closest() -> None:
    with pytest.raises(ConfigError, match=r"'concurency' \(did you mean 'concurrency'\?\)"):
        Loader(concurency=4)  # type: ignore[call-arg]


async def test_the_environment_reaches_a_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=20))
    monkeypatch.setenv("AIOLOADER_CONCURRENCY", "2")
    monkeypatch.setenv("AIOLOADER_CHUNK_SIZE", "64KiB")
    async with Loader() as loader:
        assert (loader.limits.concurrency, loader.limits.chunk_size) == (2, 64 << 10)
        assert_matches_files(await loader.load(str(path)), path)
    monkeypatch.setenv("AIOLOADER_CONCURRENCY", "lots")
    with pytest.raises(ConfigError, match="AIOLOADER_CONCURRENCY"):
        await load_model(str(path))
    assert_matches_files(await load_model(str(path), concurrency=3), path)  # explicit wins


async def test_fetch_refuses_what_only_a_load_takes(tmp_path: Path) -> None:
    for name, value in [("device", "cpu"), ("group", object()), ("cache_dir", "/x")]:
        with pytest.raises(ConfigError, match=f"{name}="):
            await ModelCache(tmp_path).fetch("http://127.0.0.1:9/m.safetensors", **{name: value})  # type: ignore[arg-type]


def test_the_command_line_has_a_flag_per_option() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for keyword in KEYWORDS:
        if keyword.parse is not None:
            assert keyword.flag in out, keyword.flag
    assert "--header" in out


def test_the_command_line_names_a_bad_flag_value(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=3))
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", str(path), "--concurrency", "0"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode != 0 and "concurrency" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", str(path), "--header", "no colon"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "Name: value" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", str(path), "--chunk-size", "64KiB",
         "--header", "X-Test: 1", "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_options_page_lists_every_option() -> None:
    page = (Path(__file__).parent.parent / "docs" / "options.md").read_text()
    for keyword in KEYWORDS:
        assert f"| `{keyword.name}` |" in page, keyword.name
        if keyword.env:
            assert keyword.variable in page
