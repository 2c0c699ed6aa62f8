"""The swarm's surface against bad input and bad luck, with real ``aioloader serve``
processes: the flags' bad values, the routes with bad keys and tokens, leftovers of a
crashed run, two daemons on one cache folder, and a seeded file that leaves the cache."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .daemon_helpers import TOKEN, Daemon, free_port, write_model
from .http_server import FaultyHttpServer

pytest.importorskip("libtorrent")
pytest.importorskip("prometheus_client")

REPO = Path(__file__).resolve().parent.parent


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``aioloader serve`` with ``args``, expected to refuse to start: (status, output)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    cmd = [sys.executable, "-m", "aioloader", "serve", "--no-auth", "--port", "0"]
    cmd += ["--cache-dir", str(tmp_path / "cache"), *args]
    done = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--peers", "garbage"], {}, "--peers"),
        (["--peers", "a:1,b c:2"], {}, "--peers"),
        (["--peers", "http://a:1"], {}, "--peers"),
        (["--peers", ",".join(f"h{i}:1" for i in range(5000))], {}, "--peers"),
        ([], {"AIOLOADER_PEERS": "a:99999"}, "AIOLOADER_PEERS"),
        (["--peers", "a:1", "--swarm-port", "-1"], {}, "--swarm-port"),
        (["--peers", "a:1", "--swarm-port", "70000"], {}, "--swarm-port"),
        (["--peers", "a:1", "--swarm-port", "six"], {}, "--swarm-port"),
        (["--peers", "a:1", "--swarm-wait", "0"], {}, "--swarm-wait"),
        (["--peers", "a:1", "--swarm-wait", "-1"], {}, "--swarm-wait"),
        (["--peers", "a:1", "--swarm-wait", "nan"], {}, "--swarm-wait"),
        (["--peers", "a:1", "--swarm-wait", "1e300"], {}, "--swarm-wait"),
        (["--peers", "a:1"], {"AIOLOADER_SWARM_WAIT": "soon"}, "AIOLOADER_SWARM_WAIT"),
        (["--peers", "a:1", "--swarm-stall", "0"], {}, "--swarm-stall"),
        (["--peers", "a:1", "--swarm-stall", "-5"], {}, "--swarm-stall"),
        (["--peers", "a:1", "--swarm-stall", "inf"], {}, "--swarm-stall"),
        (["--peers", "a:1", "--swarm-stall", "1e12"], {}, "--swarm-stall"),
        (["--peers", "a:1", "--swarm-rate", "fast"], {}, "--swarm-rate"),
        (["--peers", "a:1", "--swarm-rate", "-1MB/s"], {}, "--swarm-rate"),
        (["--peers", "a:1", "--swarm-rate", "10"], {}, "--swarm-rate"),  # under 64 KiB/s
        (["--peers", "a:1", "--swarm-rate", "3GiB/s"], {}, "--swarm-rate"),  # libtorrent: 32 bits
        (["--peers", "a:1", "--swarm-rate", "1" + "0" * 40], {}, "--swarm-rate"),
        (["--peers", "a:1"], {"AIOLOADER_SWARM_RATE": "1.5.5"}, "AIOLOADER_SWARM_RATE"),
    ],
)
def test_bad_swarm_settings_stop_the_start_naming_the_flag(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    status, output = _serve(tmp_path, *args, env=env)
    assert status == 2, output
    assert named in output, output
    assert "Traceback" not in output


def test_a_swarm_port_in_use_stops_the_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, output = _serve(
            tmp_path, "--host", "127.0.0.1", "--peers", "127.0.0.1:1", "--swarm-port", str(port)
        )
    assert status != 0, output
    assert "--swarm-port" in output and str(port) in output, output
    assert "Traceback" not in output


class _Node(Daemon):
    def __init__(self, cache: Path, peers: str, *args: str) -> None:
        super().__init__(
            cache, "--host", "127.0.0.1", "--peers", peers, "--swarm-wait", "1",
            "--swarm-stall", "10", *args, token=TOKEN,
        )  # fmt: skip


def _dead() -> str:
    return f"127.0.0.1:{free_port()}"  # listed, never started


def test_an_empty_peer_list_is_no_swarm_and_port_zero_picks_one(tmp_path: Path) -> None:
    plain = Daemon(tmp_path / "a", "--peers", "", token=TOKEN).start()
    try:
        status, body = plain.get("/v1/swarm/node")
        assert status == 404 and body["error"] == "no_swarm", body
    finally:
        assert plain.stop() == 0
    node = _Node(tmp_path / "b", _dead(), "--swarm-port", "0").start()
    try:
        status, body = node.get("/v1/swarm/node")
        assert status == 200, body
        host, _, port = body["swarm"].rpartition(":")
        assert host == "127.0.0.1" and 0 < int(port) < 65536
    finally:
        assert node.stop() == 0


def test_the_routes_refuse_bad_keys_and_tokens(tmp_path: Path) -> None:
    node = _Node(tmp_path / "cache", _dead(), "--swarm-port", "0").start()
    try:
        key = "ab" * 32
        assert node.get(f"/v1/swarm/models/{key}")[1]["error"] == "not_held"
        for bad in ("xyz", "AB" * 32, "a" * 63, "a" * 65, "g" * 64, "%2e%2e", "a" * 4000):
            status, body = node.get(f"/v1/swarm/models/{bad}")
            assert status in (400, 404), (bad, status, body)
            assert isinstance(body, dict) and body.get("error") in ("bad_key", "not_found")
        for path in ("/v1/swarm/node", f"/v1/swarm/models/{key}"):
            assert node.get(path, token="")[0] == 401  # no token at all
            assert node.get(path, token="0" * 32)[0] == 401
            assert node.get(path, token="x" * 10_000)[0] in (400, 401, 431)
    finally:
        assert node.stop() == 0


def _incoming(cache: Path) -> Path:
    return cache / ".swarm" / "incoming"


def test_leftovers_of_a_crashed_run_go_and_two_daemons_share_one_cache(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    _index, files = write_model(http_server.root / "m", shards=2, kib=256)
    url = http_server.url_for("m/model.safetensors.index.json")
    cache = tmp_path / "cache"
    incoming = _incoming(cache)
    # A run killed mid-download left its folder and its (free) lock; an older one a folder.
    (incoming / "deadbeef" / ("ab" * 32)).mkdir(parents=True)
    (incoming / "deadbeef" / ("ab" * 32) / "model.safetensors").write_bytes(b"x" * 1000)
    (incoming / "deadbeef.lock").write_bytes(b"")
    (incoming / ("cd" * 32)).mkdir()
    ports = [free_port(), free_port()]
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    first = _Node(cache, peers, "--swarm-port", "0", "--model", url)
    first.port = ports[0]
    second = _Node(cache, peers, "--swarm-port", "0", "--model", url)
    second.port = ports[1]
    try:
        first.start()
        ids = [first.get("/v1/swarm/node")[1]["node"]]
        assert sorted(p.name for p in incoming.iterdir()) == [ids[0], f"{ids[0]}.lock"]
        second.start()  # the same cache folder: its own scratch, the first's kept
        ids.append(second.get("/v1/swarm/node")[1]["node"])
        assert sorted(p.name for p in incoming.iterdir()) == sorted(
            [*ids, *(f"{i}.lock" for i in ids)]
        )
        first.wait_ready(60)
        second.wait_ready(60)
        for node in (first, second):
            (record,) = node.get("/v1/models")[1]["models"]
            folder = Path(record["path"]).parent
            for file in files:
                assert (folder / file.name).read_bytes() == file.read_bytes()
    finally:
        for node in (second, first):
            if node.proc is not None and node.proc.poll() is None:
                assert node.stop() == 0
    assert list(incoming.iterdir()) == []  # each took its own scratch away


def test_a_deleted_model_leaves_the_manifest_and_the_session(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    from aioloader.swarm.manifest import model_key

    write_model(http_server.root / "m", shards=2, kib=256)
    url = http_server.url_for("m/model.safetensors.index.json")
    node = _Node(tmp_path / "cache", _dead(), "--swarm-port", "0").start()
    try:
        status, body = node.post({"url": url, "id": "m"})
        assert status == 202, body
        node.wait_status("m", "ready", 60)
        manifest = f"/v1/swarm/models/{model_key(url)}"
        status, body = node.get(manifest)
        assert status == 200 and body["state"] == "complete", body
        assert len(body["files"]) == 3 and all(f["info_hash"] for f in body["files"])
        assert node.get("/v1/swarm/node")[1]["seeding"] == 3
        status, body = node.request("DELETE", "/v1/models/m")
        assert status == 200, body
        status, body = node.get(manifest)
        assert status == 404 and body["error"] == "not_held", body
        assert node.get("/v1/swarm/node")[1]["seeding"] == 0
        # Back again: offered again, from the new entries.
        assert node.post({"url": url, "id": "m"})[0] == 202
        node.wait_status("m", "ready", 60)
        assert node.get(manifest)[1]["state"] == "complete"
        assert node.get("/v1/swarm/node")[1]["seeding"] == 3
        # Removed behind the daemon's back (another process): found at the next look.
        for data in (tmp_path / "cache").glob("entries/*/data"):
            data.unlink()
        assert node.get(manifest)[0] == 404
        assert node.get("/v1/swarm/node")[1]["seeding"] == 0
    finally:
        assert node.stop() == 0, node.output()[-4000:]
