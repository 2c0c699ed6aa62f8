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
