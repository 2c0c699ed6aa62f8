"""The public names (what importing them costs: test_import_cost.py)."""

from __future__ import annotations

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
