"""The command exits as the interpreter would, less its teardown of every module.

With torch loaded that teardown takes seconds, and tens on a busy machine: a Ctrl-C's
"interrupted" came at once, and the process went on for over 30 s (tests/test_cancel.py
timed out in CI). An object that a ``sitecustomize`` keeps until teardown says whether
it ran; what a normal exit runs first must still run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from .helpers import write_file

_SITE = """
import atexit, sys

class _KeptUntilTeardown:
    def __del__(self):
        sys.stderr.write("torn down\\n")

kept = _KeptUntilTeardown()
atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITE)
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-m", "aioloader", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_command_skips_the_teardown_but_runs_the_exit_callbacks(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", {"w": torch.arange(6.0)})
    done = _run(tmp_path, "load", str(path))
    assert done.returncode == 0, done.stderr
    assert "atexit ran" in done.stderr, done.stderr
    assert "torn down" not in done.stderr, "the interpreter tore every module down"
    failed = _run(tmp_path, "load", str(tmp_path / "missing.safetensors"))
    assert failed.returncode == 1 and "aioloader: error:" in failed.stderr
    assert "atexit ran" in failed.stderr and "torn down" not in failed.stderr
