"""The one table of URL schemes: the sources, the cache, the daemon and the docs agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from aioloader import ConfigError, Loader, ModelCache
from aioloader.daemon.app import RequestError, check_url
from aioloader.sources.schemes import SCHEMES, listed, markdown_table, remote_names

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_show_the_table() -> None:
    text = (ROOT / "docs" / "remote-storage.md").read_text()
    shown = re.search(r"<!-- schemes:[^\n]*-->\n(.*?)\n<!-- /schemes -->", text, re.DOTALL)
    assert shown is not None, "docs/remote-storage.md lost its schemes table"
    assert shown.group(1) == markdown_table(), "regenerate it from sources/schemes.py"


def test_the_readme_names_every_scheme() -> None:
    text = (ROOT / "README.md").read_text()
    for scheme in SCHEMES:
        shown = "http(s)://" if scheme.name in ("http", "https") else scheme.display
        assert f"`{shown}`" in text, scheme.name


def test_every_extra_exists_and_every_backend_imports() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for scheme in SCHEMES:
        assert scheme.extra is None or scheme.extra in extras, scheme
        module = __import__(f"aioloader.sources.{scheme.module}", fromlist=[scheme.cls])
        assert isinstance(getattr(module, scheme.cls), type), scheme


async def test_a_load_names_every_scheme_it_reads() -> None:
    async with Loader() as loader:
        with pytest.raises(ConfigError) as caught:
            await loader.load("ftp://host/model.safetensors")
    assert listed() in str(caught.value) and "ftp" in str(caught.value)


async def test_the_cache_and_the_daemon_hold_the_remote_schemes(tmp_path: Path) -> None:
    for scheme in SCHEMES:
        url = f"{scheme.display}host/org/model"
        if scheme.remote:
            assert check_url(url).url == url
        else:
            with pytest.raises(RequestError) as refused:
                check_url(url)
            assert listed(remote=True) in refused.value.detail
            with pytest.raises(ConfigError, match=re.escape(listed(remote=True))):
                await ModelCache(tmp_path).fetch(url)
    assert remote_names() == {"http", "https", "s3", "gs", "az", "hf"}
