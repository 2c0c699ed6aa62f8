"""The daemon's token never goes wrong without a word: a trailing newline is stripped
(and said), an empty variable, a placeholder or a short token stop the start with a
message saying how to make one, and serving without a token is said, or chosen with
``--no-auth``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aioloader import ConfigError
from aioloader.daemon.config import add_arguments, config_from_args

from .daemon_helpers import TOKEN, running

pytest.importorskip("prometheus_client")


def _config(args: list[str], env: dict[str, str]) -> object:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(args), env)


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        ([], {"AIOLOADER_TOKEN": ""}, ["AIOLOADER_TOKEN is set but empty", "--no-auth"]),
        ([], {"AIOLOADER_TOKEN": " \n"}, ["AIOLOADER_TOKEN is set but empty"]),
        (["--token", ""], {}, ["--token is set but empty"]),
        ([], {"AIOLOADER_TOKEN": "change-me"}, ["placeholder", "openssl rand -hex 32"]),
        ([], {"AIOLOADER_TOKEN": "Change-Me\n"}, ["placeholder"]),
        (["--token", "s3cret"], {}, ["6 characters long", "openssl rand -hex 32"]),
        ([], {"AIOLOADER_TOKEN": "abc def ghi jkl mno"}, ["a space, a control character"]),
        ([], {"AIOLOADER_TOKEN": TOKEN + "\x00"}, ["a control character"]),
        (["--no-auth"], {"AIOLOADER_TOKEN": TOKEN}, ["pick one"]),
        ([], {"AIOLOADER_TOKEN": TOKEN, "AIOLOADER_NO_AUTH": "1"}, ["pick one"]),
        ([], {"AIOLOADER_NO_AUTH": "maybe"}, ["AIOLOADER_NO_AUTH must be 1 or 0"]),
    ],
)
def test_unusable_tokens_are_refused(
    args: list[str], env: dict[str, str], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        _config(args, env)
    message = str(info.value)
    assert all(w in message for w in words), message
    secret = env.get("AIOLOADER_TOKEN", "").strip()
    if len(secret) > 8 and "placeholder" not in message:
        assert secret not in message  # a message never shows a token (a placeholder it may)


def test_tokens_that_are_read() -> None:
    config = _config([], {"AIOLOADER_TOKEN": f"  {TOKEN}\r\n"})
    assert config.token == TOKEN and len(config.notes) == 1  # type: ignore[attr-defined]
    assert "stripped" in config.notes[0] and TOKEN not in config.notes[0]  # type: ignore[attr-defined]
    config = _config(["--no-auth"], {"AIOLOADER_TOKEN": ""})
    assert config.token is None and config.no_auth  # type: ignore[attr-defined]
    config = _config([], {"AIOLOADER_NO_AUTH": "true"})
    assert config.token is None and config.no_auth  # type: ignore[attr-defined]
    config = _config([], {})
    assert config.token is None and not config.no_auth  # type: ignore[attr-defined]


def test_a_token_with_a_trailing_newline_lets_clients_in(tmp_path: Path) -> None:
    """As a Secret made from a file carries it: the daemon strips it, and says so."""
    with running(tmp_path / "cache", env={"AIOLOADER_TOKEN": TOKEN + "\n"}) as daemon:
        assert daemon.get("/v1/models", token=TOKEN) == (200, {"models": []})
        assert daemon.get("/v1/models", token="wrong-" + TOKEN)[0] == 401
        assert daemon.stop() == 0
    assert "AIOLOADER_TOKEN had whitespace around it" in daemon.output()
    assert TOKEN not in daemon.output()


def test_serving_without_a_token_is_said(tmp_path: Path) -> None:
    with running(tmp_path / "cache") as daemon:
        assert daemon.get("/v1/models")[0] == 200
        assert daemon.stop() == 0
    assert "no token: /v1/* accepts any client" in daemon.output()
    assert "--no-auth to say this is intended" in daemon.output()
    with running(tmp_path / "cache", "--no-auth", env={"AIOLOADER_TOKEN": ""}) as daemon:
        assert daemon.get("/v1/models")[0] == 200
        assert daemon.stop() == 0
    assert "no token (--no-auth)" in daemon.output()


@pytest.mark.parametrize(
    ("token", "words"),
    [("change-me", "placeholder 'change-me'"), ("", "set but empty")],
)
def test_serve_will_not_start_with_the_shipped_or_an_empty_token(
    tmp_path: Path, token: str, words: str
) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    out = subprocess.run(
        [sys.executable, "-m", "aioloader", "serve", "--cache-dir", str(tmp_path), "--port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**environ, "AIOLOADER_TOKEN": token},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and "openssl rand -hex 32" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


# -- a daemon reachable from other hosts needs a token (issue 42) ----------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "node-7.example", "[::]", "fe80::1"])
def test_a_host_other_machines_reach_needs_a_token_or_no_auth(host: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config(["--host", host], {})
    message = str(info.value)
    for words in (host, "openssl rand -hex 32", "--no-auth", "AIOLOADER_TOKEN"):
        assert words in message, message
    assert _config(["--host", host, "--no-auth"], {}).no_auth  # type: ignore[attr-defined]
    assert _config(["--host", host], {"AIOLOADER_TOKEN": TOKEN}).token == TOKEN  # type: ignore[attr-defined]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.9", "::1", "localhost", "[::1]"])
def test_a_loopback_host_may_serve_without_a_token(host: str) -> None:
    config = _config(["--host", host], {})
    assert config.token is None and not config.no_auth  # type: ignore[attr-defined]


def test_serve_on_every_address_without_a_token_will_not_start(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    out = subprocess.run(
        [sys.executable, "-m", "aioloader", "serve", "--cache-dir", str(tmp_path),
         "--port", "0", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, check=False, env=environ,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "openssl rand -hex 32" in out.stderr and "--no-auth" in out.stderr
    assert "Traceback" not in out.stderr


# -- --token-file / AIOLOADER_TOKEN_FILE (issue 42) -------------------------------------------


def test_a_token_file_is_read_and_checked_as_a_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    for args, env in ((["--token-file", str(path)], {}), ([], {"AIOLOADER_TOKEN_FILE": str(path)})):
        config = _config([*args, "--host", "0.0.0.0"], env)
        assert config.token == TOKEN  # type: ignore[attr-defined]
        (note,) = config.notes  # type: ignore[attr-defined]
        assert "stripped" in note and str(path) in note and TOKEN not in note


def _token_file_cases(tmp_path: Path) -> list[tuple[list[str], dict[str, str], list[str]]]:
    def file(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    good = file("good", TOKEN.encode())
    return [
        (["--token-file", str(tmp_path / "missing")], {}, ["missing", "does not exist"]),
        (["--token-file", str(tmp_path)], {}, [str(tmp_path), "not a file"]),
        (["--token-file", file("empty", b"")], {}, ["empty", "openssl rand -hex 32"]),
        (["--token-file", file("blank", b" \n\n")], {}, ["blank", "empty"]),
        (["--token-file", file("huge", b"a" * (1 << 20))], {}, ["huge", "1048576 bytes"]),
        (["--token-file", file("placeholder", b"change-me\n")], {}, ["placeholder", "change-me"]),
        (["--token-file", file("binary", b"\xff\xfe" + b"a" * 30)], {}, ["binary", "UTF-8"]),
        (["--token-file", file("two", b"%s\n%s\n" % (TOKEN.encode(), TOKEN.encode()))], {},
         ["two", "a space, a control character"]),
        (["--token-file", good, "--token", TOKEN], {}, ["--token-file", "--token ", "pick one"]),
        (["--token-file", good], {"AIOLOADER_TOKEN": TOKEN}, ["--token-file", "AIOLOADER_TOKEN"]),
        ([], {"AIOLOADER_TOKEN_FILE": good, "AIOLOADER_TOKEN": TOKEN},
         ["AIOLOADER_TOKEN_FILE", "AIOLOADER_TOKEN ", "pick one"]),
        (["--token-file", good, "--no-auth"], {}, ["--token-file", "--no-auth", "pick one"]),
    ]  # fmt: skip


def test_a_token_file_that_cannot_give_a_token_is_refused_naming_it(tmp_path: Path) -> None:
    for args, env, words in _token_file_cases(tmp_path):
        with pytest.raises(ConfigError) as info:
            _config(args, env)
        message = str(info.value)
        assert all(w in message for w in words), (args, message)
        assert TOKEN not in message and len(message) < 1000


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_token_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "locked"
    path.write_text(TOKEN)
    path.chmod(0)
    with pytest.raises(ConfigError, match="cannot read"):
        _config(["--token-file", str(path)], {})


def test_serve_reads_its_token_file_at_startup(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    with running(tmp_path / "cache", "--token-file", str(path)) as daemon:
        path.write_text("changed-after-startup-0123456789")  # read once, at startup
        assert daemon.get("/v1/models", token=TOKEN) == (200, {"models": []})
        assert daemon.get("/v1/models", token=None)[0] == 401
        assert daemon.stop() == 0
    assert TOKEN not in daemon.output()
