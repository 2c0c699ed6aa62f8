"""The daemon keeps its preloads: no other fetch evicts them, and files that leave the cache
all the same are fetched again, so /ready never stays at 503 because of another client.

The real ``aioloader serve`` against the local HTTP server, with a cache cap that
holds one model of the two: the preload stays, the model posted beside it goes
over the cap or is the one evicted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aioloader.cache import ModelCache
from aioloader.cache.entry import EntryFiles

from .daemon_helpers import running, single_file
from .servers import FaultyHttpServer

pytest.importorskip("prometheus_client")


def _data(cache: Path, url: str) -> Path:
    return EntryFiles.of(cache, url).data


def test_a_posted_model_never_evicts_a_preload(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    kept = single_file(http_server.root / "kept.safetensors", kib=600, seed=1)
    posted = single_file(http_server.root / "posted.safetensors", kib=600, seed=2)
    other = single_file(http_server.root / "other.safetensors", kib=600, seed=3)
    url_kept, url_posted, url_other = (http_server.url_for(p.name) for p in (kept, posted, other))
    cache = tmp_path / "cache"
    with running(cache, "--max-cache-bytes", "1MiB", "--model", url_kept) as daemon:
        daemon.wait_ready()
        kept_id = daemon.get("/v1/models")[1]["models"][0]["id"]
        assert daemon.post({"url": url_posted, "id": "posted"})[0] == 202
        daemon.wait_status("posted", "ready")
        # Both fit only above the cap: the preload stays, and so does the node's readiness.
        assert daemon.model(kept_id)["status"] == "ready"
        status, body = daemon.get("/ready")
        assert (status, body["missing"]) == (200, []), body
        assert _data(cache, url_kept).read_bytes() == kept.read_bytes()

        # A pod's own fetch on the same cache, under the cap recorded there, evicts the
        # posted model, never the preload the daemon holds.
        asyncio.run(ModelCache(cache).fetch(url_other))
        assert _data(cache, url_kept).read_bytes() == kept.read_bytes()
        assert not _data(cache, url_posted).exists()
        daemon.wait_status("posted", "evicted")
        assert daemon.model(kept_id)["status"] == "ready"
        assert daemon.get("/ready")[0] == 200
        assert daemon.stop() == 0


def test_a_preload_whose_files_vanish_is_fetched_again(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    kept = single_file(http_server.root / "kept.safetensors", kib=256, seed=1)
    url = http_server.url_for(kept.name)
    cache = tmp_path / "cache"
    with running(cache, "--model", url) as daemon:
        daemon.wait_ready()
        model_id = daemon.get("/v1/models")[1]["models"][0]["id"]
        gets = len(http_server.gets(kept.name))
        _data(cache, url).unlink()  # deleted by hand, behind the cache's back

        def back() -> bool:
            record = daemon.model(model_id)
            return record["status"] == "ready" and len(http_server.gets(kept.name)) > gets

        # The watch sees the files gone within its interval (5 s), and the preload comes back.
        daemon.wait_for(back, 30, "the preload fetched again")
        assert _data(cache, url).read_bytes() == kept.read_bytes()
        assert daemon.get("/ready")[0] == 200
        assert daemon.metrics()["aioloader_daemon_cache_evictions_total"] >= 1
        assert daemon.stop() == 0
    assert "fetching it again" in daemon.output()


def test_a_kept_preload_can_be_deleted(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    """The pin is let go before DELETE removes the preload's files."""
    kept = single_file(http_server.root / "kept.safetensors", kib=64)
    url = http_server.url_for(kept.name)
    cache = tmp_path / "cache"
    with running(cache, "--model", url) as daemon:
        daemon.wait_ready()
        model_id = daemon.get("/v1/models")[1]["models"][0]["id"]
        assert daemon.request("DELETE", f"/v1/models/{model_id}") == (
            200,
            {"id": model_id, "deleted": True},
        )
        assert not _data(cache, url).exists()
        assert daemon.get("/v1/models")[1] == {"models": []}
        assert daemon.stop() == 0
