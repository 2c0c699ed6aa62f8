"""Gentle with the origin, for real: `aioloader serve` daemons on 127.0.0.x sharing a
model, against a local origin that counts its requests in flight and can throttle.
The cap and the signals themselves are tested in test_swarm_gentle.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aioloader.swarm.manifest import model_key

from .daemon_helpers import TOKEN, free_port, write_model
from .http_server import FaultyHttpServer
from .test_swarm_daemon import Node, _same_files

pytest.importorskip("libtorrent")


def _fleet(tmp_path: Path, first: int, *caps: str) -> list[Node]:
    hosts = [first + i for i in range(len(caps))]
    ports = [free_port(f"127.0.0.{n}") for n in hosts]
    peers = ",".join(f"127.0.0.{n}:{p}" for n, p in zip(hosts, ports, strict=True))
    nodes = []
    for n, port, cap in zip(hosts, ports, caps, strict=True):
        args = ("--swarm-origin-requests", cap) if cap else ()
        node = Node(tmp_path, n, peers, *args)
        node.port = port
        nodes.append(node)
    return nodes


def _run(nodes: list[Node], url: str) -> list[dict[str, object]]:
    """Start the nodes, then ask each for the model at once (a cold cluster whose
    daemons all listen: the deal's own subject, not a start-up race)."""
    for node in nodes:
        node.start()
    for node in nodes:
        status, body = node.post({"url": url, "id": "m"})
        assert status in (200, 202), (status, body)
    return [node.wait_status("m", "ready", 120) for node in nodes]


def test_the_cluster_keeps_to_its_cap_on_requests_in_flight_to_the_origin(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """Three nodes, three shards of 48 MiB read in 8 MiB ranges: each node alone would
    have six requests in flight; with a cap of 3 for the cluster, each has one."""
    index, files = write_model(http_server.root / "m", shards=3, kib=48 * 1024)
    url = http_server.url_for("m/model.safetensors.index.json")
    model_bytes = sum(f.stat().st_size for f in [index, *files])
    nodes = _fleet(tmp_path, 101, "3", "3", "3")
    try:
        records = _run(nodes, url)
        assert http_server.max_concurrent <= 3, (
            f"{http_server.max_concurrent} requests in flight at once for a cap of 3"
        )
        pulled = sum(int(str(r["bytes_from_origin"])) for r in records)
        assert pulled <= model_bytes + 2 * index.stat().st_size
        for node, record in zip(nodes, records, strict=True):
            _same_files(record, files, node.cache_dir)
        # Each node says what it dealt, the cap included.
        for node in nodes:
            assert re.search(r"splitting the files among 3 nodes", node.output())
    finally:
        for node in nodes:
            node.stop()


def test_a_throttling_answer_to_one_node_slows_every_node(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """The origin answers the first request for one shard 429 with Retry-After 2: the
    node that pulls it publishes the answer, the two others read it in its manifest and
    pause their own requests, each once (no echo back and forth); every cache ends
    whole and bit-identical."""
    _index, files = write_model(http_server.root / "m", shards=3, kib=4 * 1024)
    url = http_server.url_for("m/model.safetensors.index.json")
    throttled = "m/" + files[1].name
    http_server.status(throttled, 429, count=1, retry_after=2)
    nodes = _fleet(tmp_path, 111, "", "", "")
    try:
        records = _run(nodes, url)
        for node, record in zip(nodes, records, strict=True):
            _same_files(record, files, node.cache_dir)
        origin = f"http://127.0.0.1:{http_server.port}"
        heard = [node.output().count(f"was throttled by {origin}") for node in nodes]
        assert sorted(heard) == [0, 1, 1], heard
        puller = nodes[heard.index(0)]
        status, manifest = puller.get(f"/v1/swarm/models/{model_key(url)}")
        assert status == 200, (status, manifest)
        (entry,) = manifest["throttled"]
        assert (entry["origin"], entry["count"]) == (origin, 1)
    finally:
        for node in nodes:
            node.stop()


def test_nodes_with_different_caps_deal_alike(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """One node configured with a cap of 1: the lowest holds for the cluster, so one node
    pulls every file and the others follow; the origin sends the model about once."""
    index, files = write_model(http_server.root / "m", shards=3, kib=2048)
    url = http_server.url_for("m/model.safetensors.index.json")
    model_bytes = sum(f.stat().st_size for f in [index, *files])
    nodes = _fleet(tmp_path, 121, "1", "64", "0")
    try:
        records = _run(nodes, url)
        assert http_server.max_concurrent <= 1
        pullers = [r for r in records if int(str(r["bytes_from_origin"])) > index.stat().st_size]
        assert len(pullers) == 1, [r["bytes_from_origin"] for r in records]
        pulled = sum(int(str(r["bytes_from_origin"])) for r in records)
        assert pulled <= model_bytes + 2 * index.stat().st_size
        for node, record in zip(nodes, records, strict=True):
            _same_files(record, files, node.cache_dir)
    finally:
        for node in nodes:
            node.stop()


def test_a_bad_cap_stops_the_daemon_with_its_name(tmp_path: Path) -> None:
    port = free_port("127.0.0.131")
    node = Node(tmp_path, 131, f"127.0.0.131:{port}", "--swarm-origin-requests", "-3")
    node.port = port
    node.start(wait=False)
    assert node.proc is not None
    assert node.proc.wait(30) != 0
    assert "--swarm-origin-requests" in node.output()
    assert TOKEN not in node.output()
