"""Who is a peer, and what its word is worth (docs/swarm.md, "Trust").

Peers prove they hold the cluster's token both ways without sending it; a copy a peer
offers is taken only where it is the origin's current version; a file goes by its
path; a peer's sizes and "fetching" count for nothing on their own. Real daemons, a
real origin, and a fake peer on a real socket where a peer has to lie or stall.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aioloader.swarm.proof import ANSWER_HEADER, REQUEST_HEADER, PeerProof, ProofError

from . import fixtures_fleet
from .fleet import TOKEN, Fleet, Model, Origin, swarm_missing

origin, model = fixtures_fleet.origin, fixtures_fleet.model  # the shared fixtures
_url, _identical = fixtures_fleet.url_of, fixtures_fleet.identical

pytest.importorskip("prometheus_client")

_MISSING = swarm_missing()
needs_swarm = pytest.mark.skipif(_MISSING is not None, reason=f"needs the node swarm: {_MISSING}")

MIB = 1 << 20
ARGS = ["--swarm-wait", "1", "--swarm-stall", "5"]
OTHER = "a" * 32  # a token that is not the cluster's
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- the proof, pure ----------------------------------------------------------------------


def test_a_request_and_its_answer_prove_the_token_and_nothing_else() -> None:
    ours, theirs, stranger = PeerProof(TOKEN), PeerProof(TOKEN), PeerProof(OTHER)
    header, nonce = ours.sign_request("GET", "/v1/swarm/models/k", "ab" * 16, "10.0.0.1:6881")
    assert TOKEN not in header
    signed = theirs.check_request(header, "GET", "/v1/swarm/models/k")
    assert (signed.node, signed.swarm, signed.nonce) == ("ab" * 16, "10.0.0.1:6881", nonce)
    with pytest.raises(ProofError, match="replays"):
        theirs.check_request(header, "GET", "/v1/swarm/models/k")
    fresh, _ = ours.sign_request("GET", "/v1/swarm/models/k", "ab" * 16, "10.0.0.1:6881")
    wrongs: list[Callable[[], object]] = [
        lambda: stranger.check_request(fresh, "GET", "/v1/swarm/models/k"),
        lambda: theirs.check_request(fresh, "GET", "/v1/swarm/models/other"),
        lambda: theirs.check_request(
            fresh.replace("10.0.0.1", "10.0.0.2"), "GET", "/v1/swarm/models/k"
        ),
        lambda: theirs.check_request(None, "GET", "/"),
        lambda: theirs.check_request("v1; node=" + "x" * 5000, "GET", "/"),
        lambda: theirs.check_request("v2; node=a", "GET", "/"),
    ]
    for wrong in wrongs:
        with pytest.raises(ProofError):
            wrong()
    answer = theirs.sign_answer(nonce, 200, '"e"', b"{}")
    ours.check_answer(answer, nonce, 200, '"e"', b"{}")
    for args in (
        (nonce, 200, '"e"', b"{ }"),
        (nonce, 304, '"e"', b"{}"),
        ("0" * 32, 200, '"e"', b"{}"),
    ):
        with pytest.raises(ProofError):
            ours.check_answer(answer, *args)
    with pytest.raises(ProofError, match="no proof"):
        ours.check_answer(None, nonce, 200, '"e"', b"{}")
    with pytest.raises(ProofError):
        ours.check_answer(stranger.sign_answer(nonce, 200, '"e"', b"{}"), nonce, 200, '"e"', b"{}")


def test_a_request_from_another_time_is_refused() -> None:
    then = PeerProof(TOKEN, clock=1_000_000.0)
    now = PeerProof(TOKEN, clock=1_000_000.0 + 3600)
    header, _ = then.sign_request("GET", "/x", "ab" * 16, "10.0.0.1:1")
    with pytest.raises(ProofError, match="clock"):
        now.check_request(header, "GET", "/x")


# -- a fake peer on a real socket -----------------------------------------------------------


class FakePeer:
    """A peer daemon's swarm routes that answer what the test says: ``manifest(key)``
    gives the document (None: 404 not_held); ``token`` signs the answers (None: a
    stranger that signs nothing). Every request's headers are kept."""

    def __init__(self, manifest: Any, token: str | None) -> None:
        self.manifest, self.proof = manifest, PeerProof(token)
        self.headers: list[dict[str, str]] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                peer.headers.append(dict(self.headers.items()))
                nonce = None
                header = self.headers.get(REQUEST_HEADER)
                if header is not None:
                    nonce = header.split("nonce=")[-1].split(";")[0].strip()
                key = self.path.rsplit("/", 1)[-1]
                doc = peer.manifest(key)
                status = 200 if doc is not None else 404
                if doc is None:
                    doc = {"error": "not_held", "node": "ee" * 16, "swarm": "127.0.0.1:9"}
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if nonce and peer.proof.enabled:
                    proof = peer.proof.sign_answer(nonce, status, "", body)
                    self.send_header(ANSWER_HEADER, proof)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakePeer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Beside(Fleet):
    """A fleet whose nodes list the fake peer (too, with ``also``)."""

    def __init__(self, *args: Any, peer: str, also: bool = False, **kw: Any) -> None:
        self.fake, self.also = peer, also
        super().__init__(*args, **kw)

    def peers(self) -> str:
        return ",".join([self.fake, *([super().peers()] if self.also else [])])


def _offers(origin: Origin, model: Model, **changes: Any) -> list[dict[str, Any]]:
    from aioloader.swarm.manifest import file_name

    offers = []
    for path in model.files:
        url = origin.url_for(model.relpath(path, origin.root))
        st = path.stat()
        offers.append(
            {"name": file_name(url), "url": url, "size": st.st_size,
             "etag": f'"{st.st_size:x}-{st.st_mtime_ns:x}"', "last_modified": None,
             "done": 0, "torrent": None, **changes}
        )  # fmt: skip
    return offers


@needs_swarm
def test_a_stranger_at_a_listed_address_is_never_sent_the_token_nor_followed(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """Every listed address was sent the bearer token (every daemon's admin token), and
    whatever answered with a manifest was followed: a stranger on a recycled pod IP got
    the token and could have its bytes committed."""

    def manifest(key: str) -> dict[str, Any]:
        return {"key": key, "url": "x", "node": "ee" * 16, "swarm": "127.0.0.1:9",
                "state": "complete", "files": _offers(origin, model, done=1)}  # fmt: skip

    with FakePeer(manifest, token=None) as stranger:
        with _Beside(1, tmp_path / "fleet", swarm=True, args=ARGS, peer=stranger.address) as fleet:
            fleet.start()
            fleet.post(0, _url(origin, model), "llm")
            fleet.wait_ready(0, "llm", seconds=60)
            _identical(fleet, [0], model, origin)
            log = fleet[0].output()
    assert stranger.headers, "the stranger was never asked"
    for headers in stranger.headers:
        assert TOKEN not in json.dumps(headers), headers
    assert "does not have the cluster's token" in log or "sent no proof" in log, log[-3000:]
    assert "following <Follow" not in log


@needs_swarm
def test_a_peer_that_says_fetching_for_ever_is_left_after_the_stall_time(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """A peer that says "fetching" and never moves held a fetch for ever (the stall rule
    did not apply to it); its 1 TiB size for the index was taken as the file's."""

    def manifest(key: str) -> dict[str, Any]:
        index = _offers(origin, model)[0]
        index.update(size=1 << 40, done=0)
        return {"key": key, "url": "x", "node": "ee" * 16, "swarm": "127.0.0.1:9",
                "state": "fetching", "files": [index]}  # fmt: skip

    args = ["--swarm-wait", "1", "--swarm-stall", "2"]
    with FakePeer(manifest, token=TOKEN) as stuck:
        with _Beside(1, tmp_path / "fleet", swarm=True, args=args, peer=stuck.address) as fleet:
            fleet.start()
            started = time.monotonic()
            fleet.post(0, _url(origin, model), "llm")
            fleet.wait_ready(0, "llm", seconds=60)
            assert time.monotonic() - started < 45
            _identical(fleet, [0], model, origin)
            held = sum(
                p.stat().st_blocks * 512 for p in fleet[0].cache_dir.rglob("*") if p.is_file()
            )
    assert held < 4 * model.size


# -- the routes -----------------------------------------------------------------------------


def _signed_get(
    node: Any, path: str, proof: PeerProof, **headers: str
) -> tuple[int, dict[str, str], bytes, str]:
    header, nonce = proof.sign_request("GET", path, "ab" * 16, "127.0.0.77:6881")
    request = urllib.request.Request(node.url + path, headers={REQUEST_HEADER: header, **headers})
    try:
        with _OPENER.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read(), nonce
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read(), nonce


@needs_swarm
def test_the_routes_take_a_proof_and_answer_an_unchanged_manifest_with_304(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """A follower asked for the whole manifest, torrents and all, about six times a
    second, re-encoded each time: now an ETag, a kept encoding and 304."""
    from aioloader.swarm.manifest import model_key

    url = _url(origin, model)
    path = f"/v1/swarm/models/{model_key(url)}"
    with Fleet(1, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start()
        fleet.post(0, url, "llm")
        fleet.wait_ready(0, "llm", seconds=60)
        proof = PeerProof(TOKEN)
        status, headers, body, nonce = _signed_get(fleet[0], path, proof)
        assert status == 200, body
        etag = headers["ETag"]
        proof.check_answer(headers.get(ANSWER_HEADER), nonce, 200, etag, body)
        status, headers, again, nonce = _signed_get(
            fleet[0], path, proof, **{"If-None-Match": etag}
        )
        assert (status, again) == (304, b"")
        proof.check_answer(headers.get(ANSWER_HEADER), nonce, 304, etag, b"")
        # A stranger's proof, a replay, none at all: refused before anything is said.
        status, _, body, _ = _signed_get(fleet[0], path, PeerProof(OTHER))
        assert status == 401 and b"peer_unproven" in body and b"llm" not in body
        header, _ = proof.sign_request("GET", path, "ab" * 16, "127.0.0.77:6881")
        for _ in range(2):
            request = urllib.request.Request(fleet[0].url + path, headers={REQUEST_HEADER: header})
            try:
                with _OPENER.open(request, timeout=10) as response:
                    first = response.status
            except urllib.error.HTTPError as exc:
                assert exc.code == 401 and first == 200
        assert fleet[0].get(path, token="")[0] == 401
        assert fleet[0].get(path)[0] == 200  # the operator, with the bearer token
        # Torrents by their info hash: proven, bounded, nothing for a wrong hash.
        _, doc = fleet[0].get(path)
        digest = doc["files"][0]["info_hash"]
        status, headers, torrent, nonce = _signed_get(
            fleet[0], f"/v1/swarm/torrents/{digest}", proof
        )
        assert status == 200 and b"pieces" in torrent
        proof.check_answer(headers.get(ANSWER_HEADER), nonce, 200, "", torrent)
        for wrong in ("0" * 64, "zz", "a" * 5000, digest.upper()):
            got = fleet[0].get(f"/v1/swarm/torrents/{wrong}")[0]
            assert got in (404, 414, 431), (wrong[:10], got)
        assert fleet[0].get(f"/v1/swarm/torrents/{digest}", token="")[0] == 401


# -- fleets ---------------------------------------------------------------------------------


@needs_swarm
def test_a_warm_fleet_restarted_at_once_gets_ready(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """Every daemon stopped, then all started again on their warm caches: each waited
    for another to list a file it held itself (a cache hit published nothing until the
    whole fetch ended) and /ready stayed 503 for good."""
    url = _url(origin, model)
    args = [*ARGS, "--swarm-stall", "600", "--model", url]
    with Fleet(3, tmp_path / "fleet", swarm=True, args=args) as fleet:
        fleet.start()
        for node in fleet.nodes:
            fleet.wait_for(node, lambda n: n.get("/ready")[0] == 200, 90, "/ready")
        _identical(fleet, [0, 1, 2], model, origin)
        for i in range(3):
            assert fleet.stop(i) == 0
        origin.reset_counters()
        fleet.start()
        for node in fleet.nodes:
            fleet.wait_for(node, lambda n: n.get("/ready")[0] == 200, 45, "/ready after a restart")
        _identical(fleet, [0, 1, 2], model, origin)
    assert origin.bytes_total <= 0.1 * model.size


@needs_swarm
def test_a_copy_the_origin_has_superseded_is_never_taken(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """A joining node committed a peer's superseded copy though the origin now served a
    new one: a followed file's size and ETag came from the peer, not the origin."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    url = _url(origin, model)
    with Fleet(2, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start()
        fleet.post(0, url, "llm")
        fleet.wait_ready(0, "llm", seconds=60)
        shard = model.shards[0]
        tensors = load_file(str(shard))
        save_file({k: np.ascontiguousarray(v[::-1]) for k, v in tensors.items()}, str(shard))
        os.utime(shard, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a new ETag
        fleet.post(1, url, "llm")
        fleet.wait_ready(1, "llm", seconds=60)
        _identical(fleet, [1], model, origin)


@needs_swarm
def test_two_files_of_one_base_name_in_two_folders_keep_apart(
    origin: Origin, tmp_path: Path
) -> None:
    """Files went by their base name: ``a/model.safetensors`` received the bytes of
    ``b/model.safetensors``."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = origin.root / "twin"
    weight_map = {}
    for i, sub in enumerate(("a", "b")):
        (folder / sub).mkdir(parents=True)
        tensors = {f"{sub}.w": np.full(1 << 20, i + 1, dtype=np.uint16).view(np.float16)}
        save_file(tensors, str(folder / sub / "model.safetensors"))
        weight_map[f"{sub}.w"] = f"{sub}/model.safetensors"
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    twin = Model(folder, index, (folder / "a/model.safetensors", folder / "b/model.safetensors"))
    url = origin.url_for(twin.relpath(index, origin.root))
    with Fleet(2, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start()
        fleet.post(0, url, "twin")
        fleet.wait_ready(0, "twin", seconds=60)
        fleet.post(1, url, "twin")
        fleet.wait_ready(1, "twin", seconds=60)
        _identical(fleet, [0, 1], twin, origin)


class _ApartSwarm(Fleet):
    """Each node's swarm listens on an address of its own, apart from its API's."""

    def command(self, node: Any) -> list[str]:
        return [*super().command(node), "--swarm-host", f"127.0.1.{10 + node.index}"]


@needs_swarm
def test_a_swarm_apart_from_the_api_is_shared(origin: Origin, model: Model, tmp_path: Path) -> None:
    """The IP filter held the peers' API addresses only: with --swarm-host apart from
    --host nothing was shared (2.06 origin copies)."""
    url = _url(origin, model)
    with _ApartSwarm(2, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start()
        fleet.post(0, url, "llm")
        fleet.wait_ready(0, "llm", seconds=60)
        fleet.post(1, url, "llm")
        record = fleet.wait_ready(1, "llm", seconds=60)
        _identical(fleet, [0, 1], model, origin)
    assert record["bytes_from_peers"] >= 0.95 * model.size, record
    assert origin.bytes_total <= 1.1 * model.size


@needs_swarm
def test_a_pod_back_on_a_new_address_is_served_by_an_idle_holder(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """An idle holder refreshed its filter only in a fetch of its own: a node back on an
    address nobody listed was refused and pulled a full copy from the origin. Holding
    the token is what makes a peer now, not the list."""
    url = _url(origin, model)
    with Fleet(1, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start()
        fleet.post(0, url, "llm")
        fleet.wait_ready(0, "llm", seconds=60)
        moved = fleet.add(listed=False)  # on 127.0.0.11, in no one's list
        origin.reset_counters()
        fleet.start(moved.index)
        fleet.post(moved.index, url, "llm")
        record = fleet.wait_ready(moved.index, "llm", seconds=60)
        _identical(fleet, [moved.index], model, origin)
    assert record["bytes_from_peers"] >= 0.95 * model.size, record
    assert origin.bytes_total <= 0.1 * model.size


@needs_swarm
@pytest.mark.parametrize("nodes, held", [(1, False), (2, False), (2, True), (3, True)])
def test_two_fetches_of_one_model_on_one_node_at_once(
    origin: Origin, model: Model, tmp_path: Path, nodes: int, held: bool
) -> None:
    """Two fetches of one model key on one node at once (two signatures of one URL, two
    ids) ran side by side: following a holder, both downloaded the same torrents, and
    the first to finish took them out of the session under the other ("invalid torrent
    handle used"); one that failed took the model's manifest away from the other (a
    bare KeyError). They take turns now; the second finds the first's files cached."""
    url = _url(origin, model)
    with Fleet(nodes, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        fleet.start()
        if held:
            fleet.post(1, url, "llm")
            fleet.wait_ready(1, "llm", seconds=60)
        fleet.post(0, url, "one")
        fleet.post(0, f"{url}?X-Amz-Signature=0a1b2c", "two")
        fleet.wait_all("one", [0], seconds=60)
        fleet.wait_all("two", [0], seconds=60)
        _identical(fleet, [0], model, origin)
        assert "Error" not in fleet[0].output(), fleet[0].output()[-3000:]
