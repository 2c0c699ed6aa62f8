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
