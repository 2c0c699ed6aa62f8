"""Every row of the settings table, through the code that takes it: its variable is used
when nothing explicit is given, an explicit value beats it, and the default applies when
neither is set. And settings values read nothing of the host when they are made."""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from aioloader import HttpOptions, Limits, Loader, ModelCache, S3Options
from aioloader.daemon.config import DaemonConfig, add_arguments, config_from_args
from aioloader.runtime import container_memory
from aioloader.runtime.container_memory import detect_memory_limit
from aioloader.settings.options import LoadOptions
from aioloader.settings.table import (
    AZURE_IDENTITY,
    CHECK_ETAG,
    DAEMON,
    KEYWORDS,
    ROWS,
    Setting,
)
from aioloader.settings.values import staging_budget
from aioloader.sources.azure.signer import _identity_wanted

from .helpers import assert_matches_files, random_tensors, write_file

DOCS = Path(__file__).resolve().parent.parent / "docs"

# A row's text in the environment, the value it gives, and an explicit value unlike it.
_BY_PARSER: dict[str, tuple[str, Any, Any]] = {
    "integer": ("3", 3, 5),
    "seconds": ("7.5", 7.5, 2.5),
}
_LOAD_TEXT: dict[str, tuple[str, Any, Any]] = {
    "chunk_size": ("1MiB", 1 << 20, 2 << 20),
    "memory_limit": ("1MiB", 1 << 20, 2 << 20),
    "s3_addressing": ("virtual", "virtual", "path"),
    "cache_dir": ("/from/the/environment", "/from/the/environment", "/given"),
    "receive_lanes": ("auto", "auto", 3),
}
_DEFAULTS = {"limits": Limits, "http": HttpOptions, "s3": S3Options, "load": LoadOptions}


def _sample(row: Setting, default: Any) -> tuple[str, Any, Any]:
    if row.name in _LOAD_TEXT:
        return _LOAD_TEXT[row.name]
    if row.types == (bool,):  # the switch away from the default, and back explicitly
        return ("0" if default else "1"), not default, bool(default)
    assert row.parse is not None
    return _BY_PARSER[row.parse.__name__]


def _default(row: Setting) -> Any:
    (found,) = [f for f in fields(_DEFAULTS[row.group]) if f.name == row.field]
    return found.default


def _landed(built: LoadOptions, row: Setting) -> Any:
    if row.group == "load":
        return getattr(built, row.field)
    home = getattr(built, row.group) or _DEFAULTS[row.group]()
    return getattr(home, row.field)


_LOAD_ROWS = [row for row in KEYWORDS if row.env]


@pytest.mark.parametrize("row", _LOAD_ROWS, ids=[row.name for row in _LOAD_ROWS])
def test_a_load_row_takes_keyword_then_variable_then_default(row: Setting) -> None:
    default = _default(row)
    text, from_text, explicit = _sample(row, default)
    environ = {row.variable: text}
    assert _landed(LoadOptions.build(environ=environ), row) == from_text
    built = LoadOptions.build(environ=environ, **{row.name: explicit})
    assert _landed(built, row) == explicit
    nothing = _landed(LoadOptions.build(environ={}), row)
    assert nothing == (False if row.name == "cache_dir" else default)  # no cache by default


def test_every_load_row_without_a_variable_has_no_text_in_the_environment() -> None:
    environ = {f"AIOLOADER_{row.name.upper()}": "x" for row in KEYWORDS if not row.env}
    assert LoadOptions.build(environ=environ) == LoadOptions.build(environ={})


TOKEN = secrets.token_hex(16)

# A daemon row's variable text, its flag's text, and what each gives.
_DAEMON: dict[str, tuple[str, list[str], Any, Any]] = {
    # Loopback addresses: another host needs a token (test_daemon_token.py).
    "host": ("127.0.0.3", ["--host", "127.0.0.2"], "127.0.0.3", "127.0.0.2"),
    "port": ("9000", ["--port", "9001"], 9000, 9001),
    "cache_dir": ("/var/env", ["--cache-dir", "/var/flag"], Path("/var/env"), Path("/var/flag")),
    "max_cache_bytes": ("1GiB", ["--max-cache-bytes", "2GiB"], 1 << 30, 2 << 30),
    "token": (TOKEN, ["--token", TOKEN[::-1]], TOKEN, TOKEN[::-1]),
    "concurrency": ("3", ["--concurrency", "5"], 3, 5),
    "max_downloads": ("3", ["--max-downloads", "4"], 3, 4),
    "max_bandwidth": ("1MiB/s", ["--max-bandwidth", "2MiB/s"], 1 << 20, 2 << 20),
    "grace_period": ("7.5", ["--grace-period", "3"], 7.5, 3.0),
    "retry_backoff": ("2", ["--retry-backoff", "3"], 2.0, 3.0),
    "retry_backoff_max": ("30", ["--retry-backoff-max", "40"], 30.0, 40.0),
    "max_connections": ("50", ["--max-connections", "60"], 50, 60),
    "client_timeout": ("5", ["--client-timeout", "6"], 5.0, 6.0),
    "models": (
        "s3://b/a/, s3://b/c/",
        ["--model", "s3://x/y/"],
        ("s3://b/a/", "s3://b/c/"),
        ("s3://x/y/",),
    ),
    "allow_prefixes": (
        "s3://b/,gs://g/",
        ["--allow-prefix", "s3://x/"],
        ("s3://b/", "gs://g/"),
        ("s3://x/",),
    ),
    "no_auth": ("1", ["--no-auth"], True, True),
    "peers": ("a:1, B:2", ["--peers", "[::1]:3"], ("a:1", "b:2"), ("[::1]:3",)),
    "swarm_port": ("7000", ["--swarm-port", "7001"], 7000, 7001),
    "swarm_wait": ("1.5", ["--swarm-wait", "3"], 1.5, 3.0),
    "swarm_stall": ("9", ["--swarm-stall", "12"], 9.0, 12.0),
    "swarm_rate": ("1MiB/s", ["--swarm-rate", "100MB/s"], 1 << 20, 100_000_000),
    "swarm_origin_requests": ("8", ["--swarm-origin-requests", "0"], 8, 0),
    "swarm_host": ("10.0.0.1", ["--swarm-host", "10.0.0.2"], "10.0.0.1", "10.0.0.2"),
}


def _serve(flags: list[str], environ: dict[str, str]) -> DaemonConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(flags), {"HOME": "/home/h", **environ})


def _token_files(folder: Path) -> tuple[str, list[str], str, str]:
    """The token_file row's case: two files, each holding its own token."""
    (folder / "env").write_text(TOKEN + "\n")
    (folder / "flag").write_text(TOKEN[::-1])
    return str(folder / "env"), ["--token-file", str(folder / "flag")], TOKEN, TOKEN[::-1]


@pytest.mark.parametrize("row", DAEMON, ids=[row.name for row in DAEMON])
def test_a_daemon_row_takes_flag_then_variable_then_default(row: Setting, tmp_path: Path) -> None:
    if row.name == "token_file":
        text, flags, from_text, from_flag = _token_files(tmp_path)
    else:
        text, flags, from_text, from_flag = _DAEMON[row.name]
    assert getattr(_serve([], {row.variable: text}), row.field) == from_text
    against = "0" if row.name == "no_auth" else text  # the flag can only turn it on
    assert getattr(_serve(flags, {row.variable: against}), row.field) == from_flag
    (field,) = [f for f in fields(DaemonConfig) if f.name == row.field]
    default = Path("/home/h/.cache/aioloader") if row.name == "cache_dir" else field.default
    assert getattr(_serve([], {}), row.field) == default


def test_the_daemons_flags_are_its_rows() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for row in DAEMON:
        assert row.flag in text and row.variable in text, row.name
    flags = {o for action in parser._actions for o in action.option_strings}
    assert flags - {"-h", "--help"} == {row.flag for row in DAEMON}


def test_the_cache_row_check_etag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK_ETAG.variable, "0")
    assert ModelCache(tmp_path).check_etag is False
    assert ModelCache(tmp_path, check_etag=True).check_etag is True
    monkeypatch.delenv(CHECK_ETAG.variable)
    assert ModelCache(tmp_path).check_etag is CHECK_ETAG.default is True
    monkeypatch.setenv(CHECK_ETAG.variable, "")  # empty: unset, as before
    assert ModelCache(tmp_path).check_etag is True


def test_the_azure_row_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(AZURE_IDENTITY.variable, "1")
    assert _identity_wanted(None) is True
    monkeypatch.setenv(AZURE_IDENTITY.variable, "0")
    assert _identity_wanted(True) is True
    monkeypatch.delenv(AZURE_IDENTITY.variable)
    assert _identity_wanted(None) is AZURE_IDENTITY.default is False


def test_every_row_is_documented() -> None:
    options = (DOCS / "options.md").read_text()
    kubernetes = (DOCS / "kubernetes.md").read_text()
    for row in ROWS:
        if row.env:
            page = kubernetes if row.group == "daemon" else options
            assert f"`{row.variable}" in page, row.variable


# -- settings values read nothing of the host when made ------------------------------

_opened: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _opened is not None:
        _opened.append(str(args[0]))


_hooked = False


@contextlib.contextmanager
def _files_opened() -> Iterator[list[str]]:
    """The files this process opens meanwhile, as Python's audit events report them."""
    global _opened, _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True
    _opened = found = []
    try:
        yield found
    finally:
        _opened = None


def test_settings_read_nothing_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container_memory, "_last", None)  # nothing read yet
    with _files_opened() as opened:
        limits = Limits()
        LoadOptions.build(environ={"AIOLOADER_CONCURRENCY": "4"}, memory_limit="1MiB")
        HttpOptions()
        S3Options()
    assert opened == []
    assert limits.memory_limit is None  # resolved when a load asks, not kept
    with _files_opened() as opened:
        budget = limits.staging_bytes
    assert "/proc/self/cgroup" in opened
    assert budget == staging_budget(None, detect_memory_limit())


async def test_the_budget_is_probed_when_a_load_needs_it(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=4))
    async with Loader() as loader:
        stream = loader.stream(str(path))
        async with stream:
            async for _ in stream:
                pass
        assert_matches_files(await loader.load(str(path)), path)
    assert stream.report is not None
    assert stream.report.settings["memory_limit"] == staging_budget(None, detect_memory_limit())
