"""``group=`` with ``cache_dir=``: the ranks of one node share a cold cache folder.

Each rank opens every file through the cache, and one of them holds each entry's
download lock for its whole load, while the others wait for it in the exchange's
collectives. The group's timeout is set far above the test's deadline, so a rank
waiting for another's lock fails the test fast instead of ending in gloo's timeout.
"""

from __future__ import annotations

from pathlib import Path

from aioloader.sources.http.rules import PROBE_SIZE

from .servers import FaultyHttpServer
from .test_distributed import http_job, model, run_ranks

DEADLINE = 45  # seconds for both ranks to finish one load; the group's timeout is 4x


def test_ranks_load_through_a_shared_cold_cache_then_from_it(tmp_path: Path) -> None:
    world = 2
    with FaultyHttpServer(tmp_path / "www") as server:
        files = model(server.root / "m", shards=3)
        job = http_job(server, files)
        job["loader"] = {**job["loader"], "cache_dir": str(tmp_path / "cache")}
        job["group_timeout"] = DEADLINE * 4

        cold = run_ranks(world, job, tmp_path, deadline=DEADLINE)
        assert all(r.get("ok") for r in cold), cold  # every tensor bit for bit

        # The ranks have exited, so the entries' commits (run after the load, in
        # threads a process finishes before it exits) are done.
        server.reset_counters()
        warm = run_ranks(world, job, tmp_path, deadline=DEADLINE)
        sent = server.bytes_sent
    assert all(r.get("ok") for r in warm), warm
    # From the cache: each rank only reads the index and probes each file's version.
    index = (files[0].parent / "model.safetensors.index.json").stat().st_size
    assert sent <= world * (len(files) * PROBE_SIZE + index), sent


def test_a_rank_on_a_warm_cache_and_one_on_a_new_version_all_fail(tmp_path: Path) -> None:
    """Rank 0 loads its files from the cache (an old version, still what its edge says);
    rank 1's edge serves a new version: the cached copy names its version too."""
    with (
        FaultyHttpServer(tmp_path / "edge-a") as a,
        FaultyHttpServer(tmp_path / "edge-b") as b,
    ):
        files = model(a.root / "m", shards=2, seed=0)
        model(b.root / "m", shards=2, seed=1)
        for name in (p.name for p in files):
            a.set_etag(f"m/{name}", '"v1"')
            b.set_etag(f"m/{name}", '"v2"')
        job = http_job(a, files)
        job["loader"] = {**job["loader"], "cache_dir": str(tmp_path / "cache")}
        job["group_timeout"] = DEADLINE * 4
        warmed = run_ranks(2, job, tmp_path, deadline=DEADLINE)
        assert all(r.get("ok") for r in warmed), warmed
        a.reset_counters()
        job["urls"] = {"1": b.url_for("m/model.safetensors.index.json")}
        results = run_ranks(2, job, tmp_path, deadline=DEADLINE)
        assert a.bytes_sent <= len(files) * PROBE_SIZE + 4096  # rank 0 read its cache
    for r in results:
        assert "DistributedError" in r["error"], r
        assert 'its ETag differs (rank 0: "v1"; rank 1: "v2")' in r["error"], r
