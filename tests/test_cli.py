"""The command line, run as a user would run it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from aioloader import ConfigError
from aioloader.cli import _parser
from aioloader.settings.resolver import from_environment
from aioloader.settings.table import KEYWORDS

from .helpers import random_tensors, write_file, write_sharded


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aioloader", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_load_prints_report(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=5))
    out = _run("load", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Loading weights took")
    assert "5 tensors" in out.stdout


def test_load_json(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=5))
    out = _run("load", str(path), "--json", "--concurrency", "2", "--chunk-size", "1MiB")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["tensors"] == 5 and report["files"] == 1
    assert report["settings"]["concurrency"] == 2
    assert report["settings"]["chunk_size"] == 1 << 20
    assert set(report) >= {"header_seconds", "read_seconds", "copy_seconds", "total_seconds"}


def test_inspect_warns_about_dominant_tensor(tmp_path: Path) -> None:
    path = write_file(
        tmp_path / "m.safetensors",
        {"huge": torch.zeros(20 << 20, dtype=torch.float32), "small": torch.zeros(10)},
        metadata={"format": "pt"},
    )
    out = _run("inspect", str(path))
    assert out.returncode == 0, out.stderr
    assert "2 tensors" in out.stdout and "F32 x2" in out.stdout
    assert "largest tensor: huge (80.00 MiB)" in out.stdout
    assert "'huge' holds 100% of the file" in out.stderr


def test_inspect_json(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=6), metadata={"k": "v"})
    data = json.loads(_run("inspect", str(path), "--json").stdout)
    assert data["tensor_count"] == 6 and data["metadata"] == {"k": "v"}


def test_error_exit_code_and_message(tmp_path: Path) -> None:
    bad = tmp_path / "pytorch_model.bin"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    out = _run("load", str(bad))
    assert out.returncode == 1
    assert "aioloader: error:" in out.stderr and str(bad) in out.stderr
    assert "Traceback" not in out.stderr


def test_memory_limit_refused(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=2))
    out = _run("load", str(path), "--memory-limit", "1000TiB")
    assert out.returncode == 1 and "OOM" in out.stderr


def test_inspect_lists_every_tensor(tmp_path: Path) -> None:
    tensors = {
        "model.embed.weight": torch.zeros(16, 8, dtype=torch.bfloat16),
        "model.norm.bias": torch.zeros(8, dtype=torch.float32),
        "scalar": torch.zeros((), dtype=torch.int64),
    }
    path = write_file(tmp_path / "m.safetensors", tensors)
    out = _run("inspect", str(path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    embed = next(line for line in lines if line.startswith("model.embed.weight"))
    assert embed.split() == ["model.embed.weight", "BF16", "[16,", "8]", "256", "B"]
    assert any(line.split()[:3] == ["scalar", "I64", "[]"] for line in lines)
    data = json.loads(_run("inspect", str(path), "--json").stdout)
    by_name = {t["name"]: t for t in data["tensors"]}
    assert by_name["model.embed.weight"] == {
        "name": "model.embed.weight", "dtype": "BF16", "shape": [16, 8], "bytes": 256,
        "file": str(path),
    }  # fmt: skip
    assert by_name["scalar"]["shape"] == [] and by_name["model.norm.bias"]["bytes"] == 32


def test_verbose_before_and_after_the_subcommand(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=2))
    for args in (
        ("-v", "inspect", str(path)),
        ("inspect", str(path), "-v"),
        ("inspect", "-v", str(path)),
    ):
        out = _run(*args)
        assert out.returncode == 0, out.stderr
        assert "DEBUG" in out.stderr, args
    quiet = _run("inspect", str(path))
    assert "DEBUG" not in quiet.stderr


def test_cache_verify_on_a_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-cache"
    out = _run("cache", "verify", "--cache-dir", str(missing))
    assert out.returncode == 2
    assert str(missing) in out.stderr and "does not exist" in out.stderr
    assert "checked" not in out.stderr and not missing.exists()
    file = tmp_path / "a-file"
    file.write_text("x")
    out = _run("cache", "verify", "--cache-dir", str(file))
    assert out.returncode == 2 and str(file) in out.stderr


def test_inspect_into_a_closed_pipe_ends_cleanly(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", {f"t{i}": torch.zeros(2) for i in range(5000)})
    # The shell pipeline a user types: head reads one line and leaves.
    shell = f"{sys.executable} -m aioloader inspect {path} | head -1; echo rc=${{PIPESTATUS[0]}}"
    out = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.stdout.splitlines()[0].startswith(str(path))
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.stdout.splitlines()[-1] == "rc=141"


def test_load_report_says_cache_miss_hit_partial(tmp_path: Path, http_server: Any) -> None:
    www = http_server.root
    write_sharded(www / "model", random_tensors(count=6), shards=2)
    cache = tmp_path / "cache"
    first = http_server.url_for("model/model-00001-of-00002.safetensors")
    loaded = _run("load", first, "--cache-dir", str(cache), "--json")
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout)["cache"] == "miss"
    index = http_server.url_for("model/model.safetensors.index.json")
    partial = _run("load", index, "--cache-dir", str(cache))
    assert partial.returncode == 0, partial.stderr
    assert "(node cache: partial)" in partial.stdout
    hit = _run("load", index, "--cache-dir", str(cache), "--json")
    assert json.loads(hit.stdout)["cache"] == "hit"
    uncached = _run("load", index, "--json")
    assert json.loads(uncached.stdout)["cache"] is None


def test_memory_limit_suggests_a_size_flag(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=2))
    out = _run("load", str(path), "--memory-limit", "1000TiB")
    assert out.returncode == 1
    assert re.search(r"--memory-limit \d+(GiB|MiB)\b", out.stderr), out.stderr
    assert "memory_limit=" not in out.stderr


@pytest.mark.parametrize(
    ("flag", "value", "takes"),
    [
        ("--concurrency", "x", "a whole number"),
        ("--max-attempts", "2.5", "a whole number"),
        ("--deadline", "soon", "a number of seconds"),
        ("--receive-lanes", "Auto", "a whole number or auto"),
    ],
)
def test_a_bad_flag_value_says_what_the_flag_takes(
    flag: str, value: str, takes: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse names a type function that raises ValueError in its message: the
    # flags' parsers are private, so the user read "invalid _integer value".
    with pytest.raises(SystemExit):
        _parser().parse_args(["load", "model.safetensors", flag, value])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}: {value!r} is not {takes}" in error, error
    assert "_integer" not in error and "_seconds" not in error and "_lanes" not in error


def test_a_bad_variable_says_what_it_takes() -> None:
    row = next(row for row in KEYWORDS if row.name == "concurrency")
    with pytest.raises(ConfigError) as info:
        from_environment(row, {"AIOLOADER_CONCURRENCY": "eight"})
    assert "AIOLOADER_CONCURRENCY='eight'" in str(info.value)
    assert "'eight' is not a whole number" in str(info.value)
    assert "invalid literal" not in str(info.value)
