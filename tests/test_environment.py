"""Settings from the environment: misspelt ``AIOLOADER_*`` variables are said, sizes
and rates with a lower-case ``b`` (bits or bytes?) are refused, timeouts of 0 too."""

from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from aioloader import ConfigError, HttpOptions, Limits
from aioloader.daemon.config import add_arguments, config_from_args
from aioloader.settings.options import KEYWORDS, LoadOptions
from aioloader.settings.values import parse_size

from .helpers import random_tensors, write_file

PACKAGE = Path(__file__).resolve().parents[1] / "aioloader"


def _daemon(**environ: str) -> object:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args([]), environ)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aioloader.settings.resolver"]


def test_a_misspelt_variable_is_named_once_with_the_nearest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aioloader.settings.resolver")
    environ = {"AIOLOADER_CONCURENCY": "3", "AIOLOADER_STAL_TIMEOUT": "secret-looking"}
    built = LoadOptions.build(environ=environ)
    assert built.limits is not None and built.limits.concurrency == 16  # the default
    [first, second] = sorted(_warnings(caplog))
    assert first.startswith("AIOLOADER_CONCURENCY ") and "AIOLOADER_CONCURRENCY?" in first
    assert second.startswith("AIOLOADER_STAL_TIMEOUT ") and "AIOLOADER_STALL_TIMEOUT?" in second
    assert "secret-looking" not in caplog.text  # a value is never shown
    caplog.clear()
    LoadOptions.build(environ=environ)
    assert _warnings(caplog) == []  # once per process


def test_the_daemons_variables_are_known_and_its_typos_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aioloader.settings.resolver")
    good = {
        "AIOLOADER_MODELS": "s3://b/m/", "AIOLOADER_ALLOW_PREFIXES": "s3://b/",
        "AIOLOADER_MAX_DOWNLOADS": "1", "AIOLOADER_GRACE_PERIOD": "5",
        "AIOLOADER_CHECK_ETAG": "1", "AIOLOADER_S3_ADDRESSING": "path",
        "AIOLOADER_AZURE_IDENTITY": "0", "AIOLOADER_TOKEN": secrets.token_hex(16),
    }  # fmt: skip
    LoadOptions.build(environ=good)
    _daemon(**good)
    assert _warnings(caplog) == []
    _daemon(**good, AIOLOADER_MAX_DOWNLOAD="4")  # said at the daemon's startup
    [warning] = _warnings(caplog)
    assert warning.startswith("AIOLOADER_MAX_DOWNLOAD ") and "AIOLOADER_MAX_DOWNLOADS?" in warning


def test_every_variable_the_package_names_is_a_row() -> None:
    """The known names are the rows of settings.py: a variable the package names (in a
    message, a docstring) and no row reads would be warned of as unknown."""
    from aioloader.settings.resolver import known_variables
    from aioloader.settings.table import ROWS

    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"AIOLOADER_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert named - known_variables() == set()
    assert known_variables() == {row.variable for row in ROWS if row.env}
    assert {k.variable for k in KEYWORDS if k.env} <= known_variables()


def test_only_the_resolver_reads_the_environment() -> None:
    """One reader (settings/resolver.py): no other module looks a variable of
    aioloader's up by itself."""
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.search(r"environ|getenv", line) and "AIOLOADER_" in line:
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers <= {"settings/resolver.py"}


def test_the_command_line_says_a_misspelt_variable(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=3))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", str(path)],
        capture_output=True, text=True, check=False,
        env={**environ, "AIOLOADER_CHUNKSIZE": "64KiB"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "AIOLOADER_CHUNKSIZE" in done.stderr and "AIOLOADER_CHUNK_SIZE?" in done.stderr


@pytest.mark.parametrize(
    ("text", "forms"),
    [
        ("1Gb", ["1GB", "1GiB"]), ("16mb", ["16MB", "16MiB"]), ("4Kb", ["4KB", "4KiB"]),
        ("2gib", ["2GB", "2GiB"]), ("512Mib", ["512MB", "512MiB"]), ("100b", ["100B"]),
        ("1 Tb", ["1TB", "1TiB"]),
    ],
)  # fmt: skip
def test_a_lower_case_b_is_refused_as_ambiguous(text: str, forms: list[str]) -> None:
    with pytest.raises(ConfigError, match="ambiguous") as info:
        parse_size(text, what="AIOLOADER_CHUNK_SIZE")
    message = str(info.value)
    assert message.startswith("AIOLOADER_CHUNK_SIZE: ") and "bits" in message
    assert all(f"e.g. {forms[0]}" in message and form in message for form in forms)


def test_sizes_with_a_capital_b_or_none_still_read() -> None:
    assert parse_size("1GB") == 10**9 and parse_size("1kB") == 1000
    assert parse_size("16MiB") == 16 << 20 and parse_size("16mIB") == 16 << 20
    assert parse_size("2G") == 2 * 10**9 and parse_size("300B") == 300


def test_a_bandwidth_in_bits_is_refused_naming_the_variable() -> None:
    """1Gb/s is a gigabit: read as bytes it was a cap 8 times too high."""
    for value in ("1Gb/s", "800mb/s", "100Mb"):
        with pytest.raises(ConfigError, match=r"AIOLOADER_MAX_BANDWIDTH: .* is ambiguous") as info:
            _daemon(AIOLOADER_MAX_BANDWIDTH=value)
        assert "125MB/s" in str(info.value)
    assert _daemon(AIOLOADER_MAX_BANDWIDTH="125MB/s").max_bandwidth == 125 * 10**6  # type: ignore[attr-defined]


def test_a_size_in_bits_is_refused_for_a_load() -> None:
    with pytest.raises(ConfigError, match="chunk_size: '16mb' is ambiguous"):
        LoadOptions.build(environ={"AIOLOADER_CHUNK_SIZE": "16mb"})
    with pytest.raises(ConfigError, match="memory_limit: '1Gb' is ambiguous"):
        Limits(memory_limit="1Gb")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["connect_timeout", "stall_timeout"])
def test_a_timeout_of_zero_is_refused(name: str) -> None:
    """With 0 every connection (or read) failed at once, far from the setting."""
    variable = f"AIOLOADER_{name.upper()}"
    with pytest.raises(ConfigError, match=f"^{name} must be positive"):
        LoadOptions.build(environ={variable: "0"})
    with pytest.raises(ConfigError, match=f"^{name} must be positive"):
        HttpOptions(**{name: 0})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^{name} must be positive"):
        LoadOptions.build(environ={}, **{name: 0.0})  # type: ignore[arg-type]
    assert getattr(HttpOptions(**{name: 0.001}), name) == 0.001  # type: ignore[arg-type]
