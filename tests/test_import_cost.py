"""Importing the package stays cheap: a public name loads its module when first used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import aioloader

# Rooms a load reaches only when it needs them: the node cache, the Hub, the ranks.
_LATER = (
    "aioloader.cache",
    "aioloader.sources.hf",
    "aioloader.ranks.strategy",
    "aioloader.ranks.exchange",
    "aioloader.ranks.agreement",
)
# Heavy third-party packages, imported where they are called.
_HEAVY = ("torch", "aiohttp", "botocore", "multidict", "yarl", "google.auth", "azure")


def _loaded_after(statement: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules: list[str] = json.loads(out.stdout)
    return modules


def _ours(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "aioloader" or m.startswith("aioloader.")]


def _within(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules for p in prefixes if m == p or m.startswith(p + ".")]


def test_import_loads_at_most_30_of_our_modules() -> None:
    loaded = _loaded_after("import aioloader")
    assert len(_ours(loaded)) <= 30, _ours(loaded)
    assert not _within(loaded, _LATER)
    assert not _within(loaded, _HEAVY)


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    # Each name through the package's own lookup, and through ``from aioloader import``.
    code = (
        "import aioloader\n"
        "for name in aioloader.__all__:\n"
        "    getattr(aioloader, name)\n"
        f"from aioloader import {', '.join(aioloader.__all__)}\n"
    )
    _loaded_after(code)


def test_dir_lists_every_public_name() -> None:
    assert set(aioloader.__all__) <= set(dir(aioloader))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'load_modle'"):
        aioloader.load_modle  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError):
        exec("from aioloader import load_modle", {})


def test_the_loader_loads_no_remote_store() -> None:
    # A backend is imported when a URL of its kind is first used (sources/auto.py).
    loaded = _loaded_after("from aioloader import load_model")
    assert "aioloader.sources.auto" in loaded
    assert not _within(loaded, _HEAVY)
    stores = tuple(f"aioloader.sources.{s}" for s in ("http", "s3", "gcs", "azure"))
    assert not _within(loaded, stores)


def test_the_loader_loads_no_cache_hub_or_ranks() -> None:
    loaded = _loaded_after("from aioloader import load_model")
    assert not _within(loaded, _LATER)


def test_a_local_load_without_group_imports_no_cache_hub_or_exchange(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A whole load of a local file, not only the import: Solo reads everything, so the
    exchange, the agreement and the group's strategy stay out, as do the cache and the Hub."""
    import numpy as np
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file({"w": np.arange(64, dtype=np.float32)}, str(path))
    loaded = _loaded_after(
        "import asyncio, aioloader\n"
        f"asyncio.run(aioloader.load_model({str(path)!r}, framework='numpy', cache_dir=False))"
    )
    later = (*_LATER, "aioloader.ranks.group")
    assert [m for m in _within(loaded, later) if m != "aioloader.ranks.strategy"] == []
