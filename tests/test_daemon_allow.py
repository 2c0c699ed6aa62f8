"""The daemon's allow-list: the pure matcher, and the real daemon refusing to be
steered to another host by a redirect or by an index's shard."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from aioloader.daemon.allow import AllowList, UrlNotAllowedError
from aioloader.daemon.app import RequestError, check_url
from aioloader.errors import AccessDeniedError, ConfigError
from aioloader.sources.url_parts import url_parts

from .daemon_helpers import running, single_file
from .servers import FaultyHttpServer

pytest.importorskip("prometheus_client")

ALLOW = AllowList(
    ["https://h/models", "s3://bucket/llama/", "http://127.0.0.1:8080/a/", "https://bare"]
)


@pytest.mark.parametrize(
    "url",
    [
        "https://h/models",
        "https://h/models/",
        "https://h/models/x.safetensors",
        "https://H/models/x",  # the host's case does not matter (the path's does)
        "https://h:443/models/x",
        "HTTPS://h/models/x?X-Amz-Signature=abc",
        "https://h//models//x",
        "https://h/models/a%20b.safetensors",
        "s3://bucket/llama/model.safetensors.index.json",
        "s3://bucket/llama",
        "http://127.0.0.1:8080/a/b",
        "https://bare/anything/below",
    ],
)
def test_allowed(url: str) -> None:
    assert ALLOW.refusal(url) is None
    ALLOW.check(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        # Segment-wise, not string prefixes.
        ("https://h/models-evil/x", "outside"),
        ("https://h/modelsx", "outside"),
        ("https://h/", "outside"),
        ("s3://bucket/llama-evil/x", "outside"),
        # Another scheme, port or host.
        ("http://h/models/x", "outside"),
        ("https://h:8443/models/x", "outside"),
        ("https://evil/models/x", "outside"),
        ("https://h.evil/models/x", "outside"),
        ("http://127.0.0.1:8081/a/x", "outside"),
        ("http://localhost:8080/a/x", "outside"),
        ("s3://other/llama/x", "outside"),
        # Dot segments, written or encoded, and encoded separators.
        ("https://h/models/../secret", "'..'"),
        ("https://h/models/./x", "'..'"),
        ("https://h/models/%2e%2e/secret", "'..'"),
        ("https://h/models/%2E%2e/secret", "'..'"),
        ("https://h/models/.%2e/secret", "'..'"),
        ("https://h/models/..;/secret", "'..'"),
        ("s3://bucket/llama/../other/x", "'..'"),
        ("https://h/models/..%2fsecret", "encoded"),
        ("https://h/models/..%2F..%2Fsecret", "encoded"),
        ("https://h/models/..%5csecret", "encoded"),
        ("https://h/models/%252e%252e/secret", "twice"),
        ("https://h/models\\..\\secret", "backslash"),
        # User info, above all where a prefix has no trailing slash.
        ("https://bare@evil/x", "user"),
        ("https://bare:443@evil/x", "user"),
        ("https://user:pw@h/models/x", "user"),
        ("https://h/models/x\n", "control"),
        ("https://h/models/%00x", "control"),
        ("https://h:99999/models", "port"),
        ("https://[::1/models", "parsed"),
    ],
)
def test_refused(url: str, reason: str) -> None:
    refusal = ALLOW.refusal(url)
    assert refusal is not None and reason in refusal, refusal
    with pytest.raises(UrlNotAllowedError) as info:
        ALLOW.check(url)
    assert isinstance(info.value, AccessDeniedError)
    assert "--allow-prefix" in str(info.value)


def test_locations_are_normalised() -> None:
    a = url_parts("HTTPS://Example.COM/m//x/")
    assert (a.scheme, a.host, a.port, a.segments) == ("https", "example.com", 443, ("m", "x"))
    assert url_parts("http://h/a%20b").segments == ("a b",)
    assert url_parts("s3://bucket/k").port is None
    # A Unicode host is compared as written: never equal to its xn-- form.
    assert url_parts("https://bücher.de/m").host == "bücher.de"
    assert AllowList(["https://xn--bcher-kva.de/"]).refusal("https://bücher.de/m") is not None


def test_an_empty_list_allows_any_url() -> None:
    assert not AllowList()
    assert AllowList().refusal("https://anyone@anywhere/../x") is None


@pytest.mark.parametrize(
    "prefix", ["models/", "https://h/m?x=1", "https://u@h/m", "https://h/../etc", "https://h/a#b"]
)
def test_unusable_prefixes_are_config_errors(prefix: str) -> None:
    with pytest.raises(ConfigError, match="allowed prefix"):
        AllowList([prefix])


def test_refusals_name_the_url_redacted() -> None:
    with pytest.raises(UrlNotAllowedError) as info:
        ALLOW.check("https://evil/m.safetensors?X-Amz-Signature=SECRET")
    assert "https://evil/m.safetensors?X-Amz-Signature=REDACTED" in str(info.value)
    assert "SECRET" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "https://bare@evil/x.safetensors",
        "https://h/models/%2e%2e/secret.safetensors",
        "https://h/models/..%2fsecret.safetensors",
        "https://h/models-evil/x.safetensors",
    ],
)
def test_check_url_refuses_bypasses(url: str) -> None:
    with pytest.raises(RequestError) as info:
        check_url(url, ALLOW)
    assert (info.value.status, info.value.code) == (403, "url_not_allowed")


# -- the real daemon, two real servers ---------------------------------------------------


@pytest.fixture
def other_server(tmp_path: Path) -> Iterator[FaultyHttpServer]:
    """A second server: another origin (same address, another port)."""
    root = tmp_path / "other"
    root.mkdir()
    with FaultyHttpServer(root) as server:
        yield server


def _index(folder: Path, shard: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"weight": shard}}))
    return index


def test_redirect_to_another_host_is_refused(
    http_server: FaultyHttpServer, other_server: FaultyHttpServer, tmp_path: Path
) -> None:
    single_file(other_server.root / "allowed" / "m.safetensors", kib=64)
    target = other_server.url_for("allowed/m.safetensors") + "?X-Amz-Signature=SECRET"
    http_server.redirect("allowed/m.safetensors", target)
    allowed = http_server.url + "/allowed/"
    with running(tmp_path / "cache", "--allow-prefix", allowed) as daemon:
        assert daemon.post({"url": allowed + "m.safetensors", "id": "m"})[0] == 202
        record = daemon.wait_status("m", "failed", seconds=10)
        assert record["error_kind"] == "UrlNotAllowedError", record
        assert other_server.url_for("allowed/m.safetensors") in record["error"]
        assert "X-Amz-Signature=REDACTED" in record["error"]
        assert daemon.metrics()["aioloader_daemon_errors_total{kind=UrlNotAllowedError}"] == 1
        assert daemon.stop() == 0
    assert other_server.requests == []
    assert "SECRET" not in daemon.output()


def test_shards_on_another_host_are_refused(
    http_server: FaultyHttpServer, other_server: FaultyHttpServer, tmp_path: Path
) -> None:
    single_file(other_server.root / "m" / "model-1.safetensors", kib=64)
    # An index naming a shard on the other host outright...
    _index(http_server.root / "allowed" / "abs", other_server.url_for("m/model-1.safetensors"))
    # ... and one whose shard, on the allowed host, redirects there.
    _index(http_server.root / "allowed" / "moved", "model-1.safetensors")
    http_server.redirect(
        "allowed/moved/model-1.safetensors", other_server.url_for("m/model-1.safetensors")
    )
    allowed = http_server.url + "/allowed/"
    with running(tmp_path / "cache", "--allow-prefix", allowed) as daemon:
        for name in ("abs", "moved"):
            url = f"{allowed}{name}/model.safetensors.index.json"
            assert daemon.post({"url": url, "id": name})[0] == 202
        absolute = daemon.wait_status("abs", "failed", seconds=10)
        assert "model-1.safetensors" in absolute["error"], absolute
        moved = daemon.wait_status("moved", "failed", seconds=10)
        assert moved["error_kind"] == "UrlNotAllowedError", moved
        assert other_server.url_for("m/model-1.safetensors") in moved["error"]
        assert daemon.stop() == 0
    assert other_server.requests == []
