"""A fleet of real daemons and one counting origin (tests/fleet.py).

Without ``--peers`` every node pulls its own copy from the origin, as the daemon
always did: the rig's own tests check that, bit for bit, and a node killed in the
middle of it. With peers the nodes share one download: a cold cluster, a leader
killed halfway, peers listed but down, a peer holding corrupt bytes, a node joining
late and a node outside the list. Those need the swarm and skip where the tree has
none. Every assertion is on bytes (the origin's count, the nodes' records, the
cache's files), never on time: speed targets live in scripts/fleet_bench.py.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from . import fixtures_fleet
from .fleet import Fleet, Model, Origin, daemon_flag, swarm_missing

origin, model = fixtures_fleet.origin, fixtures_fleet.model  # the shared fixtures
_url, _identical = fixtures_fleet.url_of, fixtures_fleet.identical

pytest.importorskip("prometheus_client")

PROBE = 256 * 1024  # the first GET of a file reads this much again (HttpSource.PROBE_SIZE)
MIB = 1 << 20

_MISSING = swarm_missing()
needs_swarm = pytest.mark.skipif(_MISSING is not None, reason=f"needs the node swarm: {_MISSING}")
# Short bounds, so that a stalled swarm or a missing peer costs seconds, not minutes.
SWARM_ARGS = [
    *(["--swarm-wait", "1"] if daemon_flag("swarm_wait") else []),
    *(["--swarm-stall", "5"] if daemon_flag("swarm_stall") else []),
]

MakeFleet = Callable[..., Fleet]


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[MakeFleet]:
    fleets: list[Fleet] = []

    def make(n: int, swarm: bool = False, extra: tuple[str, ...] = (), **kw: object) -> Fleet:
        args = [*(SWARM_ARGS if swarm else []), *extra]  # the last of a flag counts
        fleet = Fleet(n, tmp_path / f"fleet{len(fleets)}", swarm=swarm, args=args, **kw)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


# -- the rig, and the daemon as it is without peers ----------------------------------------


def test_origin_serves_ranges_counts_and_corrupts(origin: Origin) -> None:
    data = bytes(range(256)) * 64
    (origin.root / "blob").write_bytes(data)

    def get(headers: dict[str, str], method: str = "GET") -> tuple[int, bytes]:
        request = urllib.request.Request(origin.url_for("blob"), headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    assert get({"Range": "bytes=10-19"}) == (206, data[10:20])
    assert get({"Range": "bytes=-5"}) == (206, data[-5:])
    assert get({}, "HEAD") == (200, b"")
    assert get({"Range": f"bytes={len(data)}-"})[0] == 416
    assert get({"If-Match": '"other"'})[0] == 412
    assert get({"Range": "bytes=0-0", "If-Range": '"other"'}) == (200, data)
    assert origin.bytes_total == 10 + 5 + len(data)
    assert origin.bytes_by_path() == {"blob": 10 + 5 + len(data)}
    origin.corrupt("blob", 3)
    status, body = get({"Range": "bytes=0-7"})
    assert (
        status == 206 and body[3] == data[3] ^ 0xFF and body[:3] + body[4:] == data[:3] + data[4:8]
    )
    origin.reset_counters()
    assert origin.bytes_total == 0 and origin.served == []
    assert get({}, "GET")[0] == 200 and origin.bytes_by_client() == {"127.0.0.1": len(data)}


def test_without_peers_every_node_pulls_its_own_bit_identical_copy(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet(3)
    fleet.start()
    assert [n.host for n in fleet.nodes] == ["127.0.0.10", "127.0.0.11", "127.0.0.12"]
    url = _url(origin, model)
    for i in range(3):
        fleet.post(i, url, "llm")
    records = fleet.wait_all("llm")
    assert all(r["bytes_total"] == model.size for r in records.values())
    _identical(fleet, [0, 1, 2], model, origin)
    files = len(model.files)
    assert 3 * model.size <= origin.bytes_total <= 3 * (model.size + files * PROBE)
    for path in model.files:
        size = path.stat().st_size
        assert origin.bytes_by_path()[model.relpath(path, origin.root)] >= 3 * size
    for node in fleet.nodes:
        assert node.sample("aioloader_daemon_fetched_bytes_total") == model.size
    _corrupt_entries(fleet, 2, model, origin)  # the check above is not blind
    assert len(fleet.mismatches(2, model, origin)) == len(model.shards)


def test_a_node_killed_mid_download_restarts_and_finishes(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet(2)
    fleet.start()
    url = _url(origin, model)
    origin.hold_after(model.size)  # about half of each node's copy
    fleet.post(0, url, "llm")
    fleet.post(1, url, "llm")
    fleet.wait_for(fleet[0], lambda _: origin.paused, 30, "the origin to hold halfway")
    fleet.kill(0)
    origin.resume()
    fleet.wait_ready(1, "llm")
    fleet.start(0)  # the registry starts empty: the model is asked for again
    fleet.post(0, url, "llm")
    fleet.wait_ready(0, "llm")
    _identical(fleet, [0, 1], model, origin)
    assert list(fleet[0].cache_dir.glob("entries/*/data.partial")) == []
    assert origin.bytes_total <= 3 * (model.size + len(model.files) * PROBE)


# -- with peers: one download per cluster ---------------------------------------------


def _swarm_bytes(record: dict[str, object]) -> tuple[int, int]:
    """(bytes from the origin, bytes from peers) as a node's record says."""
    assert "bytes_from_origin" in record and "bytes_from_peers" in record, record
    return int(record["bytes_from_origin"]), int(record["bytes_from_peers"])  # type: ignore[call-overload]


def _ready_pair(origin: Origin, model: Model, fleet: Fleet) -> str:
    """Nodes 0 and 1 up, both holding the model; its URL."""
    fleet.start(0, 1)
    url = _url(origin, model)
    fleet.post(0, url, "llm")
    fleet.post(1, url, "llm")
    fleet.wait_all("llm", [0, 1])
    return url


@needs_swarm
def test_cold_cluster_reads_about_one_copy_from_the_origin(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet(4, swarm=True)
    fleet.start()
    url = _url(origin, model)
    for i in range(4):
        fleet.post(i, url, "llm")
    records = fleet.wait_all("llm", seconds=120)
    _identical(fleet, [0, 1, 2, 3], model, origin)
    assert origin.bytes_total <= 1.05 * model.size
    # Each node had (nearly) all it did not pull itself from its peers.
    from_peers = sum(_swarm_bytes(r)[1] for r in records.values())
    assert from_peers >= 3 * 0.95 * model.size
    # The two shards came from the origin through two nodes' links, not one.
    pulled = sorted((_swarm_bytes(r)[0] for r in records.values()), reverse=True)
    assert pulled[1] >= 0.4 * model.size, pulled


@needs_swarm
def test_followers_wait_for_a_leader_slower_than_the_stall_time(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    """The leader pulls each 8 MiB shard for about 8 s (1 MB/s), twice the stall time.
    Followers used to take a manifest that did not change for the stall time for a dead
    leader, drop it, and pull the model from the origin themselves. (A stall time of 2 s
    was shorter than a puller's start on a loaded machine: 2.4 s to get the index from
    its follower before it opened its shard, and it was dropped for that.)"""
    fleet = make_fleet(3, swarm=True, extra=("--swarm-stall", "4", "--max-bandwidth", "1MB"))
    fleet.start()
    url = _url(origin, model)
    for i in range(3):
        fleet.post(i, url, "llm")
    fleet.wait_all("llm", seconds=120)
    _identical(fleet, [0, 1, 2], model, origin)
    logs = "\n".join(f"node {i}:\n{fleet[i].output()}" for i in range(3))
    assert origin.bytes_total <= 1.05 * model.size, logs


@needs_swarm
def test_listed_peers_that_are_down_fall_back_to_the_origin(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet(3, swarm=True)
    fleet.start(0)  # nodes 1 and 2 are listed, never started
    fleet.post(0, _url(origin, model), "llm")
    record = fleet.wait_ready(0, "llm", seconds=90)
    _identical(fleet, [0], model, origin)
    assert model.size <= origin.bytes_total <= 1.05 * model.size
    assert _swarm_bytes(record)[1] == 0


@needs_swarm
def test_listed_peers_that_fetch_nothing_leave_the_split_in_one_try(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    """Nodes 1 to 4 are up and asked for nothing: node 0 counts them in its first
    split (they may be about to ask), finds the first one it follows fetching nothing,
    and asks all again: the four are out at once, not one try each."""
    fleet = make_fleet(5, swarm=True)
    fleet.start()
    fleet.post(0, _url(origin, model), "llm")
    record = fleet.wait_ready(0, "llm", seconds=90)
    _identical(fleet, [0], model, origin)
    assert model.size <= origin.bytes_total <= 1.05 * model.size
    assert _swarm_bytes(record)[1] == 0
    drops = [line for line in fleet[0].output().splitlines() if ": dropping <Follow" in line]
    assert len(drops) <= 1, drops


def _kill_the_leader_halfway(fleet: Fleet, origin: Origin, model: Model) -> list[int]:
    """Every node of ``fleet`` (started) asks for the model; once the origin has sent
    half of it, the node pulling a file not offered yet is killed; the survivors."""
    from aioloader.swarm.deal import Deal
    from aioloader.swarm.manifest import model_key

    url = _url(origin, model)
    origin.hold_after(model.size // 2)
    for i in range(len(fleet)):
        fleet.post(i, url, "llm")
    fleet.wait_for(fleet[0], lambda _: origin.paused, 60, "the origin to hold halfway")
    # The nodes deal the files out alike (swarm/deal.py): kill the puller of a shard
    # nobody offers yet (the origin holds its reads).
    ids = {}
    for node in fleet.nodes:
        status, body = node.get("/v1/swarm/node")
        assert status == 200, body
        ids[body["node"]] = node.index
    plan = Deal(model_key(url), "", sorted(ids), {})
    shards = [p.name for p in model.shards]
    plan.expect(shards)  # as the daemons deal them: the index, routed first, apart
    offered = set()
    for node in fleet.nodes:
        status, body = node.get(f"/v1/swarm/models/{model_key(url)}")
        offered |= {f["name"] for f in body.get("files", []) if f.get("torrent")}
    leader = ids[plan.leader(next(s for s in shards if s not in offered))]
    fleet.kill(leader)
    origin.resume()
    return [i for i in range(len(fleet)) if i != leader]


@needs_swarm
def test_leader_killed_halfway_every_other_node_finishes(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet(3, swarm=True)
    fleet.start()
    survivors = _kill_the_leader_halfway(fleet, origin, model)
    fleet.wait_all("llm", survivors, seconds=120)
    _identical(fleet, survivors, model, origin)
    assert origin.bytes_total <= 2 * model.size
    # The killed node's shard twice at most, the survivors' own once: a node that goes
    # away fails only the files that follow it (their origin reads in flight used to be
    # cancelled with the whole try, and read again: 2.03x the model in one run).
    assert origin.bytes_total <= 1.5 * model.size + len(model.files) * PROBE, origin.served


@needs_swarm
def test_followers_leave_a_killed_leader_long_before_the_stall_time(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    """With --swarm-stall 600 the survivors used to wait that long on the dead leader's
    pieces; they notice it stopped answering within seconds, and one of them pulls the
    rest from the origin."""
    fleet = make_fleet(3, swarm=True, extra=("--swarm-stall", "600"))
    fleet.start()
    survivors = _kill_the_leader_halfway(fleet, origin, model)
    fleet.wait_all("llm", survivors, seconds=90)  # not 600
    _identical(fleet, survivors, model, origin)
    assert origin.bytes_total <= 2 * model.size


def _corrupt_entries(fleet: Fleet, i: int, model: Model, origin: Origin) -> None:
    """Flip a byte every 256 KiB of the tensor data of node ``i``'s cached shards."""
    for path in model.shards:
        entry = fleet[i].entry(origin.url_for(model.relpath(path, origin.root)))
        with entry.open("r+b") as fh:
            start = 8 + int.from_bytes(fh.read(8), "little")
            for at in range(start, entry.stat().st_size, 256 * 1024):
                fh.seek(at)
                byte = fh.read(1)
                fh.seek(at)
                fh.write(bytes([byte[0] ^ 0xFF]))


@needs_swarm
def test_a_peer_serving_corrupt_pieces_does_not_spoil_the_load(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet(3, swarm=True)
    _ready_pair(origin, model, fleet)
    _corrupt_entries(fleet, 0, model, origin)
    origin.reset_counters()
    fleet.start(2)
    fleet.post(2, _url(origin, model), "llm")
    record = fleet.wait_ready(2, "llm", seconds=120)
    _identical(fleet, [2], model, origin)
    assert origin.bytes_total <= 1.05 * model.size
    assert _swarm_bytes(record)[1] > 0  # the good peer served it, not the origin alone


@needs_swarm
def test_a_node_joining_later_reads_no_body_bytes_from_the_origin(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet(3, swarm=True)
    url = _ready_pair(origin, model, fleet)
    origin.reset_counters()
    fleet.start(2)
    fleet.post(2, url, "llm")
    record = fleet.wait_ready(2, "llm", seconds=90)
    _identical(fleet, [2], model, origin)
    assert origin.bytes_total == 0, origin.served
    from_origin, from_peers = _swarm_bytes(record)
    assert from_origin == 0 and from_peers >= sum(p.stat().st_size for p in model.shards)


@needs_swarm
def test_a_follower_killed_mid_swarm_download_restarts_and_finishes_from_peers(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    """Node 2 takes 1 MB/s at most from the swarm (AIOLOADER_SWARM_RATE), so it is
    killed with part of the model in its scratch folder; restarted, it clears that,
    and finishes from its peers alone."""
    fleet = make_fleet(3, swarm=True)
    url = _ready_pair(origin, model, fleet)
    origin.reset_counters()
    fleet.env["AIOLOADER_SWARM_RATE"] = "1MB/s"
    fleet.start(2)
    fleet.post(2, url, "llm")
    incoming = fleet[2].cache_dir / ".swarm" / "incoming"

    def some_came(_: object) -> bool:
        return any(p.stat().st_blocks * 512 >= MIB for p in incoming.glob("*/*/*") if p.is_file())

    fleet.wait_for(fleet[2], some_came, 60, "part of the model in the scratch folder")
    fleet.kill(2)
    del fleet.env["AIOLOADER_SWARM_RATE"]
    fleet.start(2)
    fleet.post(2, url, "llm")
    record = fleet.wait_ready(2, "llm", seconds=120)
    _identical(fleet, [2], model, origin)
    assert [p for p in incoming.rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []
    assert origin.bytes_total == 0
    assert _swarm_bytes(record)[1] >= 0.95 * model.size


@needs_swarm
def test_a_node_without_the_token_cannot_take_part(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    from aioloader.swarm.manifest import model_key

    fleet = make_fleet(2, swarm=True)
    url = _ready_pair(origin, model, fleet)
    key = model_key(url)
    for path in ("/v1/swarm/node", f"/v1/swarm/models/{key}"):
        assert fleet[0].get(path, token="")[0] == 401
        assert fleet[0].get(path, token="0" * 32)[0] == 401
        assert fleet[0].get(path)[0] == 200
    # A node that does not hold the token gets no piece from them, listed or not (one
    # that holds it is a peer wherever it is: test_swarm_trust.py).
    outsider = fleet.add(listed=False, token="b" * 32)
    origin.reset_counters()
    fleet.start(outsider.index)
    fleet.post(outsider.index, url, "llm")
    record = fleet.wait_ready(outsider.index, "llm", seconds=120)
    _identical(fleet, [outsider.index], model, origin)
    assert _swarm_bytes(record)[1] == 0
    assert origin.bytes_total >= model.size


@needs_swarm
def test_manifests_and_torrents_carry_no_credentials(
    origin: Origin, model: Model, make_fleet: MakeFleet
) -> None:
    from aioloader.swarm.manifest import model_key

    secret = "hush0a1b2c3d4e5f"
    fleet = make_fleet(2, swarm=True)
    fleet.start(0, 1)
    url = f"{_url(origin, model)}?X-Amz-Signature={secret}"
    fleet.post(0, url, "llm")
    fleet.post(1, url, "llm")
    fleet.wait_all("llm", [0, 1])
    status, manifest = fleet[0].get(f"/v1/swarm/models/{model_key(url)}")
    assert status == 200, manifest
    seen = [json.dumps(manifest), fleet[0].metrics(), json.dumps(fleet[0].get("/v1/models")[1])]
    for entry in manifest["files"]:
        assert entry["info_hash"], entry
        status, torrent = fleet[0].get(f"/v1/swarm/torrents/{entry['info_hash']}")
        assert status == 200 and "pieces" in torrent
        seen.append(torrent)
    assert [text for text in seen if secret in text] == []


@needs_swarm
def test_a_node_that_follows_is_never_followed(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """The rendezvous follower is asked first and waits for the leader; the leader, asked
    next, must pull from the origin, not follow the node that waits for it (each would
    wait for the other until the stall time, here far beyond the test's wait)."""
    from aioloader.swarm.manifest import model_key
    from aioloader.swarm.rendezvous import ranked

    url = _url(origin, model)
    key = model_key(url)
    args = ["--swarm-wait", "1", "--swarm-stall", "600"]
    with Fleet(2, tmp_path / "fleet", swarm=True, args=args) as fleet:
        fleet.start()
        ids = {}
        for node in fleet.nodes:
            status, body = node.get("/v1/swarm/node")
            assert status == 200, body
            ids[body["node"]] = node.index
        leader = ids[ranked(key, list(ids))[0]]
        follower = 1 - leader
        fleet.post(follower, url, "llm")

        def waiting(node: object) -> bool:
            status, body = fleet[follower].get(f"/v1/swarm/models/{key}")
            return status == 200 and body.get("state") != "complete"

        fleet.wait_for(fleet[follower], waiting, 30, "the follower to wait for the leader")
        fleet.post(leader, url, "llm")
        fleet.wait_all("llm", [0, 1], seconds=60)
        _identical(fleet, [0, 1], model, origin)
    assert origin.bytes_total <= 1.05 * model.size


@needs_swarm
def test_a_file_read_in_many_ranges_at_once_comes_from_one_download(
    origin: Origin, model: Model, tmp_path: Path
) -> None:
    """With 1 MiB chunks the cache reads each 8 MiB shard in eight ranges at once; each
    range used to start a download of the same torrent, replacing the one before in the
    session, whose readers then failed ("invalid torrent handle used")."""
    url = _url(origin, model)
    env = {"AIOLOADER_CHUNK_SIZE": "1MiB"}
    with Fleet(2, tmp_path / "fleet", swarm=True, args=SWARM_ARGS, env=env) as fleet:
        fleet.start()
        fleet.post(0, url, "llm")
        fleet.wait_ready(0, "llm", seconds=60)
        fleet.post(1, url, "llm")
        record = fleet.wait_ready(1, "llm", seconds=60)
        _identical(fleet, [0, 1], model, origin)
    assert _swarm_bytes(record)[1] >= 0.95 * model.size
    assert origin.bytes_total <= 1.05 * model.size
