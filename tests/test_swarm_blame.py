"""A local failure is this node's, never a peer's (issue 43).

A node that follows a peer holding the whole model, and cannot write its own cache (a
file size limit on the daemon, as a full disk would: the kernel answers EFBIG),
fails the fetch naming the local cause: the peer is not dropped, and the node does
not turn to the origin for files its own disk cannot take; so too when the limit
comes after the cache made its files, and libtorrent's own writes into them fail.
Real daemons, a real origin, a real kernel limit.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from . import fixtures_fleet
from .fleet import Fleet, Model, Origin, swarm_missing

origin, model = fixtures_fleet.origin, fixtures_fleet.model  # the shared fixtures
_url = fixtures_fleet.url_of

pytest.importorskip("prometheus_client")

_MISSING = swarm_missing()
needs_swarm = pytest.mark.skipif(_MISSING is not None, reason=f"needs the node swarm: {_MISSING}")

ARGS = ["--swarm-wait", "1", "--swarm-stall", "5"]
LIMIT = 1 << 20  # bytes: the index fits, a shard (8 MiB) does not
SLOW = "1MB/s"  # the holder's origin reads: its shards are published after seconds


def _failed(fleet: Fleet, i: int, model_id: str, seconds: float = 90) -> str:
    """Node ``i``'s error for ``model_id`` once its fetch failed (AssertionError if it
    got ready instead)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        record = fleet[i].model(model_id)
        assert record["status"] != "ready", "the fetch had nowhere to write, yet succeeded"
        if record["status"] == "failed":
            return str(record["error"])
        time.sleep(0.1)
    raise AssertionError(f"node {i}: {model_id} neither failed nor got ready:\n{fleet[i].output()}")


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit (Linux)")
@needs_swarm
def test_a_cache_that_cannot_be_written_while_following_is_not_the_peers_fault(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    url = _url(origin, model)
    with Fleet(2, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start(0)
        fleet.post(0, url, "llm")
        fleet.wait_ready(0, "llm", seconds=90)
        fleet.start(1)
        proc = fleet[1].proc
        assert proc is not None
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (LIMIT, hard))
        origin.reset_counters()
        fleet.post(1, url, "llm")
        error = _failed(fleet, 1, "llm")
        log = fleet[1].output()
    # The error names the local cause ...
    assert "File too large" in error and str(fleet[1].cache_dir) in error, error
    # ... the holder is not dropped as if it had failed, nor the origin asked instead.
    assert "dropping" not in log, log[-4000:]
    assert origin.bytes_total == 0, origin.served


def _sizes(fleet: Fleet, i: int, origin: Origin, model: Model) -> list[int]:
    """The sizes of node ``i``'s partial files of ``model``'s shards (-1: none yet)."""
    from aioloader.cache.entry import EntryFiles

    sizes = []
    for shard in model.shards:
        url = origin.url_for(model.relpath(shard, origin.root))
        partial = EntryFiles.of(fleet[i].cache_dir, url).partial
        sizes.append(partial.stat().st_size if partial.exists() else -1)
    return sizes


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit (Linux)")
@needs_swarm
def test_libtorrent_failing_to_write_the_cache_s_file_is_not_the_peers_fault(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """Node 1 follows node 0 while node 0 pulls the model from a slow origin: node 1's
    cache makes and sizes each shard's partial file, then waits for the shard's torrent.
    Only then does its file size limit fall under the shard's size, so the cache's own
    writes went through and libtorrent's writes (into those files, or into its scratch
    copies in the cache's folder where a read came first) fail (EFBIG). libtorrent
    2.1 reports that by an alert only: the torrent carries no error, and the pieces
    whose writes failed count as had (the cache took the zeros in the file for them)."""
    from aioloader.swarm.manifest import model_key

    url = _url(origin, model)
    key = model_key(url)
    shards = {model.relpath(p, origin.root) for p in model.shards}
    with Fleet(2, tmp_path / "fleet", swarm=True, args=[*ARGS, "--max-bandwidth", SLOW]) as fleet:
        fleet.start(0)
        fleet.post(0, url, "llm")  # alone: node 1 is not up, node 0 pulls every file

        def listed(node: object) -> bool:  # node 0 pulls every shard, and shows it
            status, body = fleet[0].get(f"/v1/swarm/models/{key}")
            return status == 200 and shards <= {f["name"] for f in body.get("files", [])}

        fleet.wait_for(fleet[0], listed, 30, "node 0 to list the shards it pulls")
        fleet.args = ARGS  # node 1 reads at full speed
        fleet.start(1)
        fleet.post(1, url, "llm")
        whole = [p.stat().st_size for p in model.shards]
        fleet.wait_for(
            fleet[1], lambda _: _sizes(fleet, 1, origin, model) == whole, 30,
            "node 1's cache to make its shards' files",
        )  # fmt: skip
        proc = fleet[1].proc
        assert proc is not None
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (LIMIT, hard))
        _, body = fleet[0].get(f"/v1/swarm/models/{key}")
        published = {f["name"] for f in body.get("files", []) if f.get("torrent")}
        assert not shards & published, "too late: node 0 published a shard already"
        error = _failed(fleet, 1, "llm")
        fleet.wait_ready(0, "llm", seconds=90)
        log = fleet[1].output()
    # The error names the local cause and the cache, whose file libtorrent wrote ...
    assert "File too large" in error, error
    assert f"model cache {fleet[1].cache_dir}: writing" in error, error
    # ... the holder is not dropped as if it had failed, nor the origin asked instead.
    assert "dropping" not in log, log[-4000:]
    assert origin.bytes_total <= 1.05 * model.size, origin.served
