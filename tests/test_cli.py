"""The command line, run as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from .helpers import random_tensors, write_file


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
