"""Daemons sharing a model over the swarm, for real: `aioloader serve` processes on
127.0.0.x with --peers, against a local origin that counts the body bytes it sends."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.numpy import load_file

from .daemon_helpers import TOKEN, Daemon, free_port, write_model
from .http_server import FaultyHttpServer

pytest.importorskip("libtorrent")


class Node(Daemon):
    """A daemon on its own loopback address, with the peers' list."""

    def __init__(self, tmp_path: Path, n: int, peers: str, *args: str) -> None:
        self.host = f"127.0.0.{n}"
        super().__init__(
            tmp_path / f"cache{n}",
            "--host", self.host, "--peers", peers, "--swarm-port", str(free_port(self.host)),
            "--swarm-wait", "1", "--swarm-stall", "10", *args,
            token=TOKEN,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _same_files(record: dict[str, object], files: list[Path], cache: Path) -> None:
    folder = Path(str(record["path"])).parent
    for file in files:
        got = load_file(str(folder / file.name))
        want = load_file(str(file))
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].tobytes() == want[name].tobytes()
        assert (folder / file.name).read_bytes() == file.read_bytes()


def test_a_node_gets_a_model_from_its_peer_with_no_origin_bytes(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    index, files = write_model(http_server.root / "m", shards=3, kib=512)
    url = http_server.url_for("m/model.safetensors.index.json")
    model_bytes = sum(f.stat().st_size for f in [index, *files])
    ports = [free_port("127.0.0.71"), free_port("127.0.0.72")]
    dead = "127.0.0.79:" + str(free_port("127.0.0.79"))  # named, never started: a refused connect
    peers = f"127.0.0.71:{ports[0]},127.0.0.72:{ports[1]},{dead}"
    first = Node(tmp_path, 71, peers, "--model", url)
    first.port = ports[0]
    second = Node(tmp_path, 72, peers, "--model", url)
    second.port = ports[1]
    try:
        first.start()
        first.wait_ready(60)
        assert http_server.bytes_sent >= model_bytes
        (record,) = first.get("/v1/models")[1]["models"]
        # The index is read twice: once to learn the shards, once into the cache.
        assert model_bytes <= record["bytes_from_origin"] <= model_bytes + index.stat().st_size
        assert record["bytes_from_peers"] == 0
        http_server.reset_counters()
        second.start()
        second.wait_ready(60)
        assert http_server.bytes_sent == 0, "the origin sent body bytes to the second node"
        (got,) = second.get("/v1/models")[1]["models"]
        assert got["bytes_from_origin"] == 0
        assert model_bytes <= got["bytes_from_peers"] <= model_bytes + index.stat().st_size
        _same_files(got, files, second.cache_dir)
        metrics = second.metrics()
        peers_key = f"aioloader_model_bytes_total{{model={got['id']},origin=peers}}"
        assert metrics[peers_key] == got["bytes_from_peers"]
        assert metrics["aioloader_swarm_peers_banned_total"] == 0
        status, node = second.get("/v1/swarm/node")
        assert status == 200 and node["swarm"].startswith("127.0.0.72:")
        # A manifest never leaks the token or a URL's secrets, and is behind the token.
        status, _ = second.request("GET", "/v1/swarm/node", token="0" * 32)
        assert status == 401
    finally:
        for node in (second, first):
            if node.proc is not None:
                assert node.stop() == 0
    assert not list((second.cache_dir / ".swarm" / "incoming").glob("*/*"))  # scratch gone


class _Liar:
    """A 'peer' on 127.0.0.78 answering every request with ``body`` (HTTP ``status``)."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        import http.server
        import threading

        liar = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                liar.asked += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.asked = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.78", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="liar")
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.mark.parametrize(
    "body, status",
    [
        (b"not json", 200),
        (b'{"node": "ab"}', 500),
        (b'{"node": "abab", "key": "x", "state": "complete", "files": "no"}', 200),
        (b"[1, 2]", 404),
        (b'{"node": "' + b"a" * 32 + b'", "key": 5}', 200),
    ],
)
def test_a_lying_peer_is_ignored_and_the_origin_serves(
    tmp_path: Path, http_server: FaultyHttpServer, body: bytes, status: int
) -> None:
    _index, files = write_model(http_server.root / "m", shards=2, kib=64)
    url = http_server.url_for("m/model.safetensors.index.json")
    liar = _Liar(body, status)
    port = free_port("127.0.0.73")
    try:
        node = Node(tmp_path, 73, f"127.0.0.73:{port},127.0.0.78:{liar.port}", "--model", url)
        node.port = port
        node.start()
        try:
            node.wait_ready(60)
            (got,) = node.get("/v1/models")[1]["models"]
            assert got["bytes_from_peers"] == 0 and got["bytes_from_origin"] > 0
            _same_files(got, files, node.cache_dir)
            assert liar.asked >= 1
        finally:
            assert node.stop() == 0
    finally:
        liar.close()
