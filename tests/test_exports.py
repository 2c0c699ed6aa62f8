"""The public names, and that importing the package stays cheap."""

from __future__ import annotations

import subprocess
import sys

import aioloader


def test_all_is_sorted_and_complete() -> None:
    assert aioloader.__all__ == sorted(aioloader.__all__)
    for name in aioloader.__all__:
        assert hasattr(aioloader, name), name
        if name != "__version__":
            assert getattr(aioloader, name).__module__.startswith("aioloader"), name


def test_errors_subclass_builtins() -> None:
    assert issubclass(aioloader.FormatError, ValueError)
    assert issubclass(aioloader.NotFoundError, FileNotFoundError)
    assert issubclass(aioloader.SelectionError, KeyError)
    for name in aioloader.__all__:
        obj = getattr(aioloader, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, aioloader.LoaderError), name


def test_import_does_not_load_torch() -> None:
    code = "import sys, aioloader; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_import_loads_no_remote_store() -> None:
    # A backend is imported when a URL of its kind is first used (sources/auto.py); torch
    # and botocore only where they are called.
    code = "import sys, aioloader; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "aioloader.sources.auto" in loaded
    heavy = {"aiohttp", "botocore", "torch", "multidict", "yarl", "google.auth", "azure"}
    assert not heavy & loaded
    stores = ("http", "s3", "gcs", "azure")
    assert not [m for m in loaded for s in stores if m.startswith(f"aioloader.sources.{s}")]
