"""hf:// in the daemon: the allow-list's Hub prefixes (pure), the API's checks, and
the real ``aioloader serve`` filling its cache from a local Hub (tests/hub_server.py),
a lying one and a refusing one included, and two daemons on one cache at once."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aioloader.cache import ModelCache
from aioloader.daemon.allow import AllowList, HfPrefix, UrlNotAllowedError, parse_hf_prefix
from aioloader.daemon.app import RequestError, check_url
from aioloader.errors import ConfigError

from .daemon_helpers import Daemon, running
from .helpers import some_big, write_sharded
from .hub_server import LocalHub

pytest.importorskip("prometheus_client")
pytest.importorskip("huggingface_hub")

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "f" * 40


# -- the allow-list's Hub prefixes (pure) ------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "parsed"),
    [
        ("hf://org", HfPrefix("org")),
        ("hf://Org/", HfPrefix("org")),
        ("hf://org/name", HfPrefix("org", "name")),
        ("hf://org/name/", HfPrefix("org", "name")),
        ("hf://org/Name@v1", HfPrefix("org", "name", "v1")),
        ("hf://org/name@main/sub/dir", HfPrefix("org", "name", "main", ("sub", "dir"))),
        ("hf://org/name@feature%2Fx", HfPrefix("org", "name", "feature/x")),
    ],
)
def test_hf_prefixes_are_parsed(prefix: str, parsed: HfPrefix) -> None:
    assert parse_hf_prefix(prefix) == parsed


HUB = AllowList(["hf://org/", "hf://other/name", "hf://pinned/model@v1", "hf://deep/m@main/sub"])


@pytest.mark.parametrize(
    "url",
    [
        "hf://org/anything",
        "hf://ORG/Anything@dev/x.safetensors",  # the Hub looks names up case-insensitively
        "hf://other/name",
        f"hf://other/name@{SHA}/model.safetensors",
        "hf://pinned/model@v1",
        "hf://pinned/model@v1/model.safetensors.index.json",
        "hf://deep/m/sub/x.safetensors",  # no revision is main
        "hf://deep/m@main/sub",
    ],
)
def test_hf_urls_inside(url: str) -> None:
    assert HUB.refusal(url) is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("hf://other/na", "outside"),  # a repository name is never a string prefix
        ("hf://other/name-evil", "outside"),
        ("hf://org-evil/x", "outside"),
        ("hf://pinned/model", "outside"),  # main, not v1
        ("hf://pinned/model@v10", "outside"),
        (f"hf://pinned/model@{SHA}", "outside"),  # a commit alone is not the tag
        ("hf://deep/m@dev/sub", "outside"),
        ("hf://deep/m/subway/x", "outside"),
        ("hf://deep/m", "outside"),
        ("https://huggingface.co/org/x", "outside"),  # hf:// prefixes allow only hf://
        ("hf://org/x/../../evil/y", "well-formed"),
        ("hf://org/x@a..b", "well-formed"),
        ("hf://org", "well-formed"),
        ("hf://org/x?y=1", "well-formed"),
        ("hf://org/x/a\nb", "well-formed"),
        ("hf://org/" + "x" * 5000, "well-formed"),
    ],
)
def test_hf_urls_outside(url: str, reason: str) -> None:
    refusal = HUB.refusal(url)
    assert refusal is not None and reason in refusal, refusal


def test_the_hub_prefix_other_way_round() -> None:
    # "hf://org/na" does not allow "hf://org/name", and neither allows any http URL.
    narrow = AllowList(["hf://org/na"])
    assert narrow.refusal("hf://org/na") is None
    assert narrow.refusal("hf://org/name") is not None
    assert AllowList(["https://h/org/na"]).refusal("hf://org/na") is not None


@pytest.mark.parametrize(
    "prefix",
    ["hf://", "hf:///", "hf://org/na--me", "hf://org/name@", "hf://org/name@a..b", "hf://o/n?x=1"],
)
def test_bad_hf_prefixes_are_config_errors(prefix: str) -> None:
    with pytest.raises(ConfigError, match="allowed prefix"):
        AllowList([prefix])


@pytest.mark.parametrize("prefix", [None, 3, b"hf://org/"])
def test_a_prefix_that_is_not_a_string_is_a_config_error(prefix: Any) -> None:
    with pytest.raises(ConfigError, match="must be a str"):
        AllowList([prefix])


def test_a_fetch_reads_its_own_repository_at_the_resolved_commit() -> None:
    policy = HUB.for_fetch("hf://pinned/model@v1")
    policy(f"hf://pinned/model@{SHA}/model-00001-of-00002.safetensors")
    for url in (
        f"hf://pinned/other@{SHA}/x.safetensors",  # another repository
        "hf://pinned/model@v2/x.safetensors",  # another branch is no commit
    ):
        with pytest.raises(UrlNotAllowedError, match="may not be fetched"):
            policy(url)


@pytest.mark.parametrize(
    "target",
    [
        "https://cdn-lfs.hf.co/repos/ab/cd/0123/4567?Expires=1&Signature=x",
        "https://cas-bridge.xethub.hf.co/xet-bridge-us/abc/def?X-Amz-Signature=x",
        "http://127.0.0.1:1/blob",  # a mirror's (or the local Hub's) own storage host
    ],
)
def test_an_allowed_hub_model_follows_the_hub_to_its_storage_host(target: str) -> None:
    """An hf:// prefix allows the files of its models wherever the Hub serves them."""
    HUB.for_fetch("hf://pinned/model@v1")(target)
    HUB.for_fetch("hf://org/anything")(target)
    # Only an hf:// fetch follows the Hub: an https:// model is held to the list.
    with pytest.raises(UrlNotAllowedError, match="outside the allowed prefixes"):
        AllowList(["https://h/models/", "hf://org/"]).for_fetch("https://h/models/m")(target)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("https://user@cdn-lfs.hf.co/x", "names a user"),
        ("https://cdn-lfs.hf.co/a/../../x", "'..'"),
        ("https://cdn-lfs.hf.co/a%2f..%2fx", "encoded"),
        ("https://cdn-lfs.hf.co/a\nb", "whitespace or a control character"),
        ("file:///etc/passwd", "no host"),
        ("ftp://cdn-lfs.hf.co/x", "not an http(s) URL"),
    ],
)
def test_an_unsafe_hub_redirect_is_refused(target: str, reason: str) -> None:
    with pytest.raises(UrlNotAllowedError, match="where the Hub redirected") as info:
        HUB.for_fetch("hf://org/anything")(target)
    assert reason in str(info.value)
    deep = HUB.for_fetch("hf://deep/m@main/sub")
    deep(f"hf://deep/m@{SHA}/sub/x.safetensors")
    with pytest.raises(UrlNotAllowedError, match="may not be fetched"):
        deep(f"hf://deep/m@{SHA}/elsewhere.safetensors")  # outside the allowed folder
    assert AllowList().for_fetch("hf://a/b") is not None  # empty: any URL
    AllowList().for_fetch("hf://a/b")("http://anywhere/x")


# -- the API's checks --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("hf://org/name", None),
        (f"hf://org/name@{SHA}/model.safetensors", None),
        ("hf://org", "bad_url"),
        ("hf://org/", "bad_url"),
        ("hf:///name", "bad_url"),
        ("hf://org/na--me", "bad_url"),
        ("hf://org/name@", "bad_url"),
        ("hf://org/name@x@y", "bad_url"),
        ("hf://org/name/../x", "bad_url"),
        ("hf://org/name?revision=dev", "bad_url"),
        ("hf://org/" + "n" * 5000, "bad_url"),
        ("", "missing_url"),
        (["hf://org/name"], "missing_url"),
        ({"url": "hf://org/name"}, "missing_url"),
        (7, "missing_url"),
        (None, "missing_url"),
    ],
)
def test_check_url_takes_hf_urls(url: Any, code: str | None) -> None:
    if code is None:
        assert check_url(url).url == url
        return
    with pytest.raises(RequestError) as info:
        check_url(url)
    assert (info.value.status, info.value.code) == (400, code)


def test_check_url_applies_the_hub_prefixes() -> None:
    allow = AllowList(["hf://org/name"])
    assert check_url("hf://org/name@dev", allow).url == "hf://org/name@dev"
    with pytest.raises(RequestError) as info:
        check_url("hf://org/name2", allow)
    assert (info.value.status, info.value.code) == (403, "url_not_allowed")


# -- the real daemon against a local Hub -------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    with LocalHub(tmp_path) as server:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        # This process checks the daemons' caches against the same Hub.
        for name, value in _env(server, tmp_path).items():
            monkeypatch.setenv(name, value)
        yield server


def _env(hub: LocalHub, tmp_path: Path, **more: str) -> dict[str, str]:
    home = tmp_path / "hf-home"
    home.mkdir(exist_ok=True)
    # An empty HF_HOME and no token file of the machine's own login.
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_TOKEN_PATH": str(home / "none")}
    return env | more


def _publish(hub: LocalHub, tmp_path: Path, repo: str, seed: int = 1) -> dict[str, bytes]:
    folder = tmp_path / f"src-{repo.replace('/', '-')}-{seed}"
    write_sharded(folder, some_big(seed), shards=2)
    (folder / "config.json").write_text('{"model_type": "test"}')
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    hub.commit(repo, files)
    return files


def _assert_cached(cache_dir: Path, url: str, files: dict[str, bytes]) -> None:
    """The cache holds every weight file of ``url`` byte for byte (a hit, no download)."""
    cached = asyncio.run(ModelCache(cache_dir).fetch(url))
    assert cached.hit and cached.downloaded == 0, cached
    names = {u.rsplit("/", 1)[1]: Path(p) for u, p in cached.files.items()}
    assert set(names) == {n for n in files if n.endswith((".safetensors", ".index.json"))}
    for name, path in names.items():
        assert path.read_bytes() == files[name], name


def test_preload_and_post_hf_models(hub: LocalHub, tmp_path: Path) -> None:
    files = _publish(hub, tmp_path, "org/preloaded")
    more = _publish(hub, tmp_path, "org/posted", seed=2)
    cache = tmp_path / "cache"
    with running(cache, "--model", "hf://org/preloaded", env=_env(hub, tmp_path)) as daemon:
        daemon.wait_ready(seconds=30)
        status, body = daemon.post({"url": "hf://org/posted@main", "id": "posted"})
        assert status == 202, body
        daemon.wait_status("posted", "ready", seconds=30)
        assert daemon.get("/ready?model=posted")[0] == 200
        assert daemon.post({"url": "hf://org/na--me"})[1]["error"] == "bad_url"
        assert daemon.stop() == 0
    _assert_cached(cache, "hf://org/preloaded", files)
    _assert_cached(cache, "hf://org/posted@main", more)


def test_the_allow_list_matches_hub_repositories(hub: LocalHub, tmp_path: Path) -> None:
    files = _publish(hub, tmp_path, "org/name")
    _publish(hub, tmp_path, "org/na", seed=2)
    env = _env(hub, tmp_path)
    cache = tmp_path / "cache"
    args = ("--allow-prefix", "hf://org/na", "--allow-prefix", hub.storage.url + "/")
    with running(cache, *args, env=env) as daemon:
        status, body = daemon.post({"url": "hf://org/name"})
        assert (status, body["error"]) == (403, "url_not_allowed"), body
        assert daemon.post({"url": "hf://org/na", "id": "na"})[0] == 202
        daemon.wait_status("na", "ready", seconds=30)
        assert daemon.stop() == 0
    # The repository alone allows its files, from the storage host the Hub redirects to,
    # and the branch's files are read at its commit, which the fetch may.
    storage_before = len(hub.storage.requests)
    with running(cache, "--allow-prefix", "hf://org/name@main", env=env) as daemon:
        assert daemon.post({"url": "hf://org/name", "id": "name"})[0] == 202
        record = daemon.wait_status("name", "ready", seconds=30)
        assert record["error"] is None, record
        assert daemon.stop() == 0
    assert len(hub.storage.requests) > storage_before
    _assert_cached(cache, "hf://org/name", files)


def test_a_preload_outside_the_allow_list_stops_the_start(hub: LocalHub, tmp_path: Path) -> None:
    daemon = Daemon(
        tmp_path / "cache",
        "--allow-prefix",
        "hf://org/na",
        "--model",
        "hf://org/name",
        env=_env(hub, tmp_path),
    )
    daemon.start(wait=False)
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=30) != 0
    assert "hf://org/name" in daemon.output() and "outside the allowed prefixes" in daemon.output()


def test_a_refusing_or_lying_hub_fails_the_model(hub: LocalHub, tmp_path: Path) -> None:
    _publish(hub, tmp_path, "org/private")
    hub.private("org/private", {"hf_secret_token"})
    _publish(hub, tmp_path, "org/gated", seed=2)
    hub.gated("org/gated", set())
    liar = _publish(hub, tmp_path, "org/liar", seed=3)
    # The storage host serves another length than the Hub lists for a shard.
    shard = next(n for n in liar if n.endswith(".safetensors"))
    blob = hub.storage.root / hashlib.sha256(liar[shard]).hexdigest()
    blob.write_bytes(liar[shard] + b"\0" * 64)
    cache = tmp_path / "cache"
    with running(cache, env=_env(hub, tmp_path)) as daemon:
        cases = {
            "missing": ("hf://org/nowhere", "AccessDeniedError", "huggingface-cli login"),
            "private": ("hf://org/private", "AccessDeniedError", "org/private"),
            "gated": ("hf://org/gated", "AccessDeniedError", "licence"),
            "branch": ("hf://org/gated@nope", "AccessDeniedError", "org/gated"),
            "liar": ("hf://org/liar", "SourceError", "the Hub lists"),
        }
        for key, (url, _, _) in cases.items():
            assert daemon.post({"url": url, "id": key})[0] == 202
        for key, (_url, kind, words) in cases.items():
            record = daemon.wait_status(key, "failed", seconds=30)
            assert record["error_kind"] == kind, record
            assert words in record["error"], record
        status, body = daemon.get("/ready")
        assert status == 200 and "liar" in str(body["pending"])  # none of them is a preload
        assert daemon.get("/ready?model=liar")[0] == 503
        assert daemon.stop() == 0
    assert "hf_secret_token" not in daemon.output()


def test_a_flaky_storage_host_is_retried(hub: LocalHub, tmp_path: Path) -> None:
    files = _publish(hub, tmp_path, "org/flaky")
    hub.storage.status(None, 503, count=3)
    hub.storage.short_body(None, count=2)
    cache = tmp_path / "cache"
    with running(cache, "--model", "hf://org/flaky", env=_env(hub, tmp_path)) as daemon:
        daemon.wait_ready(seconds=60)
        assert daemon.stop() == 0
    _assert_cached(cache, "hf://org/flaky", files)


def test_a_private_repository_with_the_token(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _publish(hub, tmp_path, "org/private")
    hub.private("org/private", {"hf_secret_token"})
    env = _env(hub, tmp_path, HF_TOKEN="hf_secret_token")
    cache = tmp_path / "cache"
    with running(cache, "--model", "hf://org/private", env=env) as daemon:
        daemon.wait_ready(seconds=30)
        assert daemon.stop() == 0
    assert "hf_secret_token" not in daemon.output()
    # The token went to the Hub, never to the storage host.
    assert all("Authorization" not in h for h in hub.storage.request_headers)
    assert any(r.headers.get("Authorization") == "Bearer hf_secret_token" for r in hub.log)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token")
    _assert_cached(cache, "hf://org/private", files)


def test_two_daemons_fill_one_cache_at_once(hub: LocalHub, tmp_path: Path) -> None:
    files = _publish(hub, tmp_path, "org/shared")
    cache = tmp_path / "cache"
    env = _env(hub, tmp_path)
    with (
        running(cache, "--model", "hf://org/shared", env=env) as first,
        running(cache, "--model", "hf://org/shared", env=env) as second,
    ):
        first.wait_ready(seconds=60)
        second.wait_ready(seconds=60)
        assert first.stop() == 0 and second.stop() == 0
    _assert_cached(cache, "hf://org/shared", files)
