"""A local failure is this node's, never a peer's (issue 43).

A node that follows a peer holding the whole model, and cannot write its own cache (a
file size limit on the daemon, as a full disk would: the kernel answers EFBIG),
fails the fetch naming the local cause: the peer is not dropped, and the node does
not turn to the origin for files its own disk cannot take. Real daemons, a real
origin, a real kernel limit.
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
