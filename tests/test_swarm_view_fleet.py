"""The cluster's view end to end (``GET /v1/swarm/view``, ``aioloader swarm view``): real
daemons sharing a model over the real swarm (tests/fleet.py), asked while the fetch
runs with the origin held, while a node is killed, twice at once, and once done; its
token and query refused as a client gets them wrong. Pure parts: test_swarm_view.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from . import fixtures_fleet
from .fleet import REPO, TOKEN, Fleet, Model, Node, Origin, daemon_flag, swarm_missing
from .http_server import FaultyHttpServer

origin, model = fixtures_fleet.origin, fixtures_fleet.model  # the shared fixtures

_MISSING = swarm_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"needs the swarm: {_MISSING}")

WAIT = 1  # --swarm-wait: how long a view waits for each peer
ARGS = ["--swarm-wait", str(WAIT), "--swarm-stall", "30"] if daemon_flag("swarm_wait") else []


def _view(node: Node, cluster: bool = True) -> dict[str, Any]:
    status, body = node.get("/v1/swarm/view" + ("?cluster=1" if cluster else ""), timeout=20)
    assert status == 200, f"node {node.index}: the view answered {status}: {body}"
    return body  # type: ignore[no-any-return]


def _files(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for node in view["nodes"] for m in node["models"] for f in m["files"]]


def _as_peer(node: Node, target: str, token: str = TOKEN) -> int:
    """The status of ``target`` asked of ``node`` as a peer asks: signed, no bearer."""
    from aioloader.swarm.proof import REQUEST_HEADER, PeerProof

    header, _ = PeerProof(token).sign_request("GET", target, "ab" * 16, "127.0.0.99:1")
    request = urllib.request.Request(node.url + target, headers={REQUEST_HEADER: header})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _cli(node: Node, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["AIOLOADER_TOKEN"] = token
    command = [sys.executable, "-m", "aioloader", "swarm", "view", "--daemon", node.url, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_the_view_of_a_fetch_running_a_node_killed_and_done(
    tmp_path: Path, origin: Origin, model: Model
) -> None:
    url = fixtures_fleet.url_of(origin, model)
    with Fleet(3, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start()
        first = fleet[0]

        # Who may ask, and how: the bearer token as every /v1 route; the query checked.
        assert first.get("/v1/swarm/view", token="")[0] == 401
        assert first.get("/v1/swarm/view", token="not-the-token")[0] == 401
        for query in ("cluster=maybe", "cluster=", "cluster=1&cluster=1", "clustr=1",
                      "cluster=" + "1" * 2000):  # fmt: skip
            status, body = first.get(f"/v1/swarm/view?{query}")
            assert status == 400, (query, status, body)
            assert body["error"] == "bad_query" and "cluster" in body["detail"]
        # A peer is answered for its node only (no fan-out asked of a peer); a stranger not.
        assert _as_peer(first, "/v1/swarm/view") == 200
        assert _as_peer(first, "/v1/swarm/view?cluster=1") == 400
        assert _as_peer(first, "/v1/swarm/view", token="f" * 32) == 401
        empty = _view(first)
        assert len(empty["nodes"]) == 3 and empty["unreachable"] == []
        assert all(n["models"] == [] for n in empty["nodes"])

        # A cold fetch held by the origin a quarter in: the nodes pull their share, and
        # follow. Held halfway, the origin stopped at about the end of one of the two
        # shards: a puller that started first had its whole shard (it holds it), the
        # other was held before its first byte (waiting), and no node was shown pulling.
        origin.hold_after(model.size // 4)
        for i in range(3):
            fleet.post(i, url, "llm")
        fleet.wait_for(first, lambda _: origin.paused, 30, "the origin to hold")
        fleet.wait_for(
            first,
            lambda n: any(f["role"] == "origin" for f in _files(_view(n))),
            20,
            "a node shown pulling from the origin",
        )
        running = _view(first)
        ids = [n["node"] for n in running["nodes"]]
        assert len(set(ids)) == 3
        for node in running["nodes"]:
            (shown,) = node["models"]
            assert shown["state"] in ("fetching", "following")
            for f in shown["files"]:
                assert f["flags"] == [] and 0 <= f["done"] <= f["size"]
                if f["role"] == "follows":
                    assert f["follows"] in ids and f["follows"] != node["node"]
        pulled = sum(n["bytes_from_origin"] for n in running["nodes"])
        assert 0 < pulled <= origin.bytes_total
        # Two views at once, from two nodes, while the fetch runs.
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(_view, [fleet[0], fleet[1]]))
        assert [len(v["nodes"]) for v in both] == [3, 3]
        printed = _cli(first)
        assert printed.returncode == 0, printed.stderr
        assert "model " in printed.stdout and "nodes:" in printed.stdout
        assert any(i[:8] in printed.stdout for i in ids)

        # A node killed: listed unreachable, with the reason, within the wait.
        fleet.kill(2)
        started = time.monotonic()
        after = _view(first)
        assert time.monotonic() - started < 10 * WAIT
        assert [u["api"] for u in after["unreachable"]] == [fleet[2].address]
        assert after["unreachable"][0]["reason"]
        assert len(after["nodes"]) == 2
        refused = _cli(fleet[2])
        assert refused.returncode == 1 and "did not answer" in refused.stderr
        wrong = _cli(first, token="not-the-token")
        assert wrong.returncode == 1 and "401" in wrong.stderr and "--token" in wrong.stderr

        # Done: every file whole on the nodes alive, its bytes counted as the records say.
        origin.resume()
        records = fleet.wait_all("llm", [0, 1], seconds=90)
        done = _view(first)
        for node in done["nodes"]:
            (shown,) = node["models"]
            assert shown["state"] == "complete"
            assert {f["role"] for f in shown["files"]} <= {"holds", "seeds"}
            assert all(f["done"] == f["size"] for f in shown["files"])
        by_id = {n["node"]: n for n in done["nodes"]}
        own = by_id[_view(first, cluster=False)["nodes"][0]["node"]]
        record = records[0]
        assert (own["bytes_from_origin"], own["bytes_from_peers"]) == (
            record["bytes_from_origin"],
            record["bytes_from_peers"],
        )
        json_out = _cli(first, "--json")
        assert json_out.returncode == 0 and '"unreachable"' in json_out.stdout


def test_the_view_shows_who_pulls_and_who_follows_each_range_of_a_one_file_model(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """Three nodes split a 96 MiB file whose origin pauses a second after every 2 MiB
    sent: while they pull, each node's view lists every range of the file, read here
    from the origin (by this node, once in the cluster) or followed from its puller,
    and the table and its line say so; once done, the file is whole on every node."""
    from .daemon_helpers import TOKEN as NODE_TOKEN
    from .daemon_helpers import single_file
    from .test_swarm_ranges import _fleet

    file = single_file(http_server.root / "m" / "w.safetensors", kib=96 * 1024)
    url, size = http_server.url_for("m/w.safetensors"), file.stat().st_size
    http_server.stall("m/w.safetensors", 1.0, after_bytes=2 << 20, count=1000)
    nodes = _fleet(tmp_path, 191, 3)

    def ranged(view: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [(n["node"], f) for n in view["nodes"] for m in n["models"] for f in m["files"]]

    def asked(node: Any) -> dict[str, Any]:
        status, body = node.get("/v1/swarm/view?cluster=1")
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def pulling(view: dict[str, Any]) -> bool:
        shown = ranged(view)
        return len(shown) == 3 and all(
            any(r["role"] == "origin" for r in f["ranges"]) for _, f in shown
        )

    try:
        for node in nodes:
            node.start()
        for node in nodes:
            assert node.post({"url": url, "id": "m"})[0] in (200, 202)
        deadline = time.monotonic() + 60
        while not pulling(view := asked(nodes[0])):
            assert time.monotonic() < deadline, view
            time.sleep(0.1)
        ids = {n["node"] for n in view["nodes"]}
        pulled = []
        for holder, f in ranged(view):
            ranges = f["ranges"]
            assert f["flags"] == [] and f["done"] == sum(r["done"] for r in ranges)
            assert [r["offset"] for r in ranges] == [
                sum(r["length"] for r in ranges[:i]) for i in range(len(ranges))
            ]
            assert sum(r["length"] for r in ranges) == size
            for r in ranges:
                assert r["node"] in ids and 0 <= r["done"] <= r["length"]
                if r["role"] == "origin":
                    assert r["node"] == holder
                    pulled.append(r["offset"])
                elif r["role"] == "follows":
                    assert r["node"] != holder
        assert sorted(pulled) == sorted({r["offset"] for _, f in ranged(view) for r in f["ranges"]})
        printed = _cli(nodes[0], token=NODE_TOKEN)  # type: ignore[arg-type]
        assert printed.returncode == 0, printed.stderr
        assert "ranges: 1 origin, 2 follows" in printed.stdout, printed.stdout
        assert "range [0 B, " in printed.stdout, printed.stdout
        assert "which is itself at" in printed.stdout and "of m/w.safetensors" in printed.stdout
        for node in nodes:
            node.wait_status("m", "ready", 180)
        done = asked(nodes[0])
        for _, f in ranged(done):
            assert f["role"] in ("holds", "seeds") and f["done"] == size
    finally:
        for node in nodes:
            node.stop()
