"""What the cache creates stays inside its folder: names are checked in their decoded
form, and symbolic links planted below the folder are refused, never followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioloader import CacheError, ModelCache, load_model
from aioloader.cache.entry import key_of
from aioloader.cache.links import ModelLinks
from aioloader.sources.layout import ModelLayout

from .helpers import assert_matches_files, random_tensors, write_file
from .servers import FaultyHttpServer


def tree(folder: Path) -> list[str]:
    """Everything below ``folder``, links included (not followed)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("name", ["..%2f..%2f..%2fvictim.safetensors", "%2e%2e%2fvictim"])
async def test_encoded_dot_segments_in_a_url_never_leave_the_cache(
    http_server: FaultyHttpServer, tmp_path: Path, name: str
) -> None:
    write_file(http_server.root / "m.safetensors", random_tensors())
    # The server answers the odd path with a redirect to a real file, as a hostile
    # server would: the request succeeds, the name is the attack.
    http_server.redirect(name.replace("%2f", "/").replace("%2e", "."), "m.safetensors")
    url = f"{http_server.url}/{name}"
    root = tmp_path / "cache"
    before = tree(tmp_path)

    with pytest.raises(CacheError) as info:
        await ModelCache(root).fetch(url)
    message = str(info.value)
    assert url in message and "'..'" in message and "nothing was written" in message
    assert [p for p in tree(tmp_path) if not p.startswith("cache")] == [
        p for p in before if not p.startswith("cache")
    ]
    assert not (root / "models").exists() or tree(root / "models") == []
    assert http_server.gets() == []  # refused before any download


def test_shard_names_are_checked_after_decoding() -> None:
    base = "http://h/m/"

    def plan(*shards: str) -> ModelLinks:
        index = base + "model.safetensors.index.json"
        layout = ModelLayout(index=index, files=shards)
        return ModelLinks.plan(index, layout, lambda url: url.rsplit("/", 1)[0])

    ok = plan(base + "a.safetensors", base + "sub/b.safetensors", "http://other/c.safetensors")
    assert [name for _, name in ok.links] == [
        "a.safetensors", "sub/b.safetensors", "c.safetensors", "model.safetensors.index.json",
    ]  # fmt: skip
    for bad in ("%2e%2e/%2e%2e/x", "sub/..%2f..%2f..%2fx", "a%00b", "sub/%2e/x", "%2fetc"):
        with pytest.raises(CacheError, match="nothing was written") as info:
            plan(base + "a.safetensors", base + bad)
        assert base + bad in str(info.value)
    with pytest.raises(CacheError, match="would both be linked as"):
        plan(base + "a.safetensors", "http://other/a.safetensors")


async def test_files_with_one_name_in_a_list_are_both_linked(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    one = write_file(http_server.root / "x" / "m.safetensors", random_tensors(seed=1))
    two = write_file(http_server.root / "y" / "m.safetensors", random_tensors(seed=2))
    urls = [http_server.url_for("x/m.safetensors"), http_server.url_for("y/m.safetensors")]
    model = await ModelCache(tmp_path / "cache").fetch(urls)
    assert isinstance(model.path, list) and len(set(model.path)) == 2
    assert Path(model.path[0]).read_bytes() == one.read_bytes()
    assert Path(model.path[1]).read_bytes() == two.read_bytes()


# -- planted links -----------------------------------------------------------------------


@pytest.fixture
def served(http_server: FaultyHttpServer) -> tuple[str, Path]:
    path = write_file(http_server.root / "m.safetensors", random_tensors())
    return http_server.url_for("m.safetensors"), path


async def test_a_linked_entry_folder_is_refused(served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    root, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "data.partial"
    victim.write_text("precious")
    (root / "entries").mkdir(parents=True)
    link = root / "entries" / key_of(url)
    link.symlink_to(outside)
    with pytest.raises(CacheError) as info:
        await ModelCache(root).fetch(url)
    assert str(link) in str(info.value) and "symbolic link" in str(info.value)
    with pytest.raises(CacheError) as info:
        await load_model(url, cache_dir=root)
    assert str(link) in str(info.value) and "symbolic link" in str(info.value)
    assert tree(outside) == ["data.partial"] and victim.read_text() == "precious"


@pytest.mark.parametrize("planted", ["entries", "models", "lock"])
async def test_links_planted_below_the_cache_are_refused(
    served: tuple[str, Path], tmp_path: Path, planted: str
) -> None:
    url, _ = served
    root, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    target = outside / "target"
    if planted == "lock":  # a file that following the link would create
        link = root / "entries" / key_of(url) / "lock"
    else:  # a folder that following the link would fill
        link = root / planted
        target.mkdir()
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    with pytest.raises(CacheError) as info:
        await ModelCache(root).fetch(url)
    assert str(link) in str(info.value) and "symbolic link" in str(info.value)
    assert tree(outside) == (["target"] if planted != "lock" else [])


async def test_the_cache_folder_itself_may_be_a_link(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    url, path = served
    (tmp_path / "real").mkdir()
    root = tmp_path / "cache"
    root.symlink_to(tmp_path / "real")
    model = await ModelCache(root).fetch(url)
    assert_matches_files(await load_model(str(model.path)), path)
    assert_matches_files(await load_model(url, cache_dir=root), path)
    assert (tmp_path / "real" / "entries" / key_of(url) / "data").is_file()
