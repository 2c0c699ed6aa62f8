"""The cluster's view (swarm/view.py, looking.py, diagnosis.py): the counts and rates a
node keeps, a peer's view checked (a wrong shape refused, impossible numbers kept and
flagged), the one-line diagnoses over plain values, and a node gathering its peers'
views from peers that hang, answer garbage, too much, without a proof, or lie.
The daemons end to end: test_swarm_view_fleet.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from aioloader.swarm.counts import RATE_WINDOW, Meter, Reads
from aioloader.swarm.diagnosis import diagnose, render
from aioloader.swarm.view import (
    ClusterView,
    FileView,
    ModelView,
    NodeView,
    RangeView,
    Unreachable,
    ViewError,
    parse_cluster,
    parse_node,
)

from .peer_servers import serving

TOKEN = "5e0c2b9d71a4f8e36b1d0c9a7e52f4b8"
KEY = "ab" * 32
A, B, C, D = ("a1" * 16, "b2" * 16, "c3" * 16, "d4" * 16)
MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- counts ----------------------------------------------------------------------------


def test_a_meter_gives_the_rate_of_the_last_seconds_and_falls_to_zero_when_idle() -> None:
    clock = Clock()
    meter = Meter(clock)
    assert meter.rate() == 0.0
    for _ in range(10):  # 1 MiB every half second for 5 s: 2 MiB/s
        meter.add(MIB)
        clock.now += 0.5
    assert meter.total == 10 * MIB
    assert meter.rate() == pytest.approx(2 * MIB, rel=0.15)
    clock.now += RATE_WINDOW + 1
    assert meter.rate() == 0.0
    assert meter.total == 10 * MIB  # the total stays


def test_a_meter_just_started_is_not_averaged_over_the_whole_window() -> None:
    clock = Clock()
    meter = Meter(clock)
    meter.add(MIB)
    clock.now += 1.0
    meter.add(MIB)
    assert meter.rate() == pytest.approx(2 * MIB)  # 2 MiB in 1 s, not in 5


def test_reads_count_each_file_and_the_model() -> None:
    reads = Reads(clock=Clock())
    reads.from_origin("a/model.safetensors", 100)
    reads.from_peers("b/model.safetensors", 50)  # two files of one base name keep apart
    reads.from_peers("b/model.safetensors", 25)
    assert (reads.origin, reads.peers) == (100, 75)
    assert reads.files["a/model.safetensors"].origin.total == 100
    assert reads.files["b/model.safetensors"].peers.total == 75
    assert reads.files["b/model.safetensors"].origin.total == 0


# -- a view checked --------------------------------------------------------------------


def _file(name: str = "shard-1", **kw: object) -> FileView:
    values: dict[str, object] = {"size": 100 * MIB, "done": 45 * MIB, "role": "origin"}
    values.update(kw)
    return FileView(name, **values)  # type: ignore[arg-type]


def _node(node: str, *files: FileView, state: str = "fetching", api: str = "") -> NodeView:
    model = ModelView(KEY, "http://origin/m/index.json", state, tuple(files))
    return NodeView(node, api or f"10.0.0.{node[1]}:8790", "10.0.0.1:6881", 1.0, (model,))


def test_a_view_round_trips_through_its_json() -> None:
    view = _node(A, _file(rate=3.0 * MIB, bytes_from_origin=45 * MIB), _file("shard-2"))
    again = parse_node(json.loads(json.dumps(view.as_dict())), "peer x")
    assert again == view
    assert again.model(KEY) is not None and again.flags == ()


def test_a_lying_peer_is_shown_as_it_reports_and_flagged() -> None:
    doc = _node(A, _file()).as_dict()
    file = doc["models"][0]["files"][0]  # type: ignore[index]
    file.update(done=200 * MIB, bytes_from_origin=-5, rate=-1.0, role="teleports")
    doc["bytes_from_peers"] = -7
    view = parse_node(doc, "peer x")
    shown = view.models[0].files[0]
    assert shown.done == 200 * MIB and shown.bytes_from_origin == -5  # as reported
    assert any("200%" in f for f in shown.flags)
    assert any("bytes_from_origin is negative" in f for f in shown.flags)
    assert any("rate is negative" in f for f in shown.flags)
    assert any("teleports" in f for f in shown.flags)
    assert any("bytes_from_peers is negative" in f for f in view.flags)
    line = diagnose(ClusterView((view,)), view, view.models[0])
    assert line is not None and line.startswith("reports what cannot be")


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(node="../../etc"),
        lambda d: d.update(node=None),
        lambda d: d.update(models="all of them"),
        lambda d: d.update(models=[{"key": KEY}] * 2000),
        lambda d: d["models"][0].update(files=[{}]),
        lambda d: d["models"][0]["files"][0].update(size="big"),
        lambda d: d["models"][0]["files"][0].update(done=True),
        lambda d: d["models"][0]["files"][0].update(role=7),
        lambda d: d["models"][0]["files"][0].update(name="x\n" * 3),
        lambda d: d["models"][0]["files"][0].update(name="x" * 5000),
        lambda d: d.update(time="yesterday"),
    ],
)
def test_a_view_of_the_wrong_shape_is_refused(change: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    doc = json.loads(json.dumps(_node(A, _file()).as_dict()))
    change(doc)
    with pytest.raises(ViewError, match="peer x"):
        parse_node(doc, "peer x")


@pytest.mark.parametrize("doc", [None, [], "view", {"nodes": "x"}, {"nodes": [], "unreachable": 1}])
def test_a_cluster_answer_of_the_wrong_shape_is_refused(doc: object) -> None:
    with pytest.raises(ViewError, match="daemon"):
        parse_cluster(doc, "the daemon")


def test_non_finite_numbers_are_flagged() -> None:
    doc = _node(A, _file()).as_dict()
    doc["download_rate"] = float("nan")
    view = parse_node(json.loads(json.dumps(doc)), "peer x")
    assert view.download_rate == 0.0 and any("nan" in f for f in view.flags)


# -- why a node is slow ----------------------------------------------------------------


def _three() -> ClusterView:
    """A pulls shard-1 from the origin (45 %, 3 MiB/s) and holds shard-2; B follows A for
    shard-1 (30 %) and has shard-2 from A; C follows D, which does not answer."""
    a = _node(
        A,
        _file(rate=3 * MIB, bytes_from_origin=45 * MIB),
        _file("shard-2", done=100 * MIB, role="seeds", upload_rate=9 * MIB, peers=2,
              bytes_from_origin=100 * MIB),
    )  # fmt: skip
    b = _node(
        B,
        _file(done=30 * MIB, role="follows", follows=A, follows_api="10.0.0.a:8790", rate=2 * MIB,
              peers=1, bytes_from_peers=30 * MIB),
        _file("shard-2", done=100 * MIB, role="holds", bytes_from_peers=100 * MIB),
        state="following",
    )  # fmt: skip
    c = _node(
        C,
        _file(done=0, role="follows", follows=D, follows_api="10.0.0.d:8790"),
        state="following",
    )
    return ClusterView((a, b, c), (Unreachable("10.0.0.d:8790", "no answer within 1 s"),))


def test_a_follower_of_a_node_itself_behind_is_told_so() -> None:
    cluster = _three()
    b = cluster.nodes[1]
    line = diagnose(cluster, b, b.models[0])
    assert line == (
        f"following {A[:8]} for shard-1 (here 30.0%), which is itself at 45% "
        "(pulling it from the origin at 3.00 MiB/s)"
    )


def test_a_puller_says_its_origin_rate_and_a_follower_of_a_dead_node_says_so() -> None:
    cluster = _three()
    a, _, c = cluster.nodes
    assert diagnose(cluster, a, a.models[0]) == (
        "pulling shard-1 (here 45.0%) from the origin at 3.00 MiB/s"
    )
    line = diagnose(cluster, c, c.models[0])
    assert line is not None and "does not answer: no answer within 1 s" in line


def test_no_peers_an_idle_origin_and_waiting_are_told() -> None:
    holder = _node(A, _file(done=100 * MIB, role="holds"), state="complete")
    stuck = _node(B, _file(done=10, role="follows", follows=A), state="following")
    idle = _node(C, _file(done=10, role="origin", rate=0.0))
    waiting = _node(D, _file(done=0, role="waiting"))
    cluster = ClusterView((holder, stuck, idle, waiting))
    assert diagnose(cluster, holder, holder.models[0]) is None
    assert "no peers connected" in (diagnose(cluster, stuck, stuck.models[0]) or "")
    assert "nothing in the last" in (diagnose(cluster, idle, idle.models[0]) or "")
    assert "not decided yet" in (diagnose(cluster, waiting, waiting.models[0]) or "")


def test_the_line_names_what_holds_the_node_back_most_not_the_file_furthest_behind() -> None:
    """Node 7 follows A for shard-1 (9 %, A itself at 45 %) and B for shard-2 (31 %, B
    holds it whole): no peer connected for shard-2 is what to fix first."""
    a = _node(A, _file(rate=3 * MIB))
    b = _node(B, _file("shard-2", done=100 * MIB, role="holds"), state="complete")
    seven = _node(
        C,
        _file(done=9 * MIB, role="follows", follows=A, rate=MIB, peers=1),
        _file("shard-2", done=31 * MIB, role="follows", follows=B, peers=0),
        state="following",
    )
    cluster = ClusterView((a, b, seven))
    assert diagnose(cluster, seven, seven.models[0]) == (
        f"following {B[:8]} for shard-2 (here 31.0%), which has it whole, but no peers "
        "connected; 1 more file(s) not whole"
    )


def test_the_table_shows_every_node_and_file_and_the_unreachable() -> None:
    lines = render(_three())
    text = "\n".join(lines)
    assert lines[0].startswith(f"model {KEY[:12]}")
    for node in (A, B, C):
        assert node[:8] in text
    assert "follows " + A[:8] in text and "seeds 9.00 MiB/s" in text
    assert "45.0%" in text and "30.0%" in text
    assert "unreachable 10.0.0.d:8790: no answer within 1 s" in text
    assert text.count("\n  ") >= 6
    assert all(line == line.rstrip() for line in lines)


def test_an_empty_cluster_says_so() -> None:
    lines = render(ClusterView((NodeView(A, None, "10.0.0.1:6881", 1.0),)))
    assert lines[0] == "no node fetches or offers a model"


# -- a file dealt in byte ranges -------------------------------------------------------


def _split() -> ClusterView:
    """One 96 MiB file in three ranges: A pulls [0, 32) (50 %), B [32, 64) (done), C
    [64, 96) (nothing yet); A follows B and C, B follows A and C; C follows A and D,
    which is not in the view (a fourth range of C's own cut)."""
    size, third = 96 * MIB, 32 * MIB

    def ranges(*roles: tuple[str, str, int]) -> tuple[RangeView, ...]:
        return tuple(RangeView(i * third, third, done, role, node)
                     for i, (role, node, done) in enumerate(roles))  # fmt: skip

    a = _node(A, _file("w", size=size, done=16 * MIB + third, ranges=ranges(
        ("origin", A, 16 * MIB), ("holds", B, third), ("follows", C, 0))))  # fmt: skip
    b = _node(B, _file("w", size=size, done=third, ranges=ranges(
        ("follows", A, 0), ("holds", B, third), ("follows", C, 0))))  # fmt: skip
    c = _node(C, _file("w", size=size, done=0, ranges=ranges(
        ("follows", D, 0), ("follows", B, 0), ("origin", C, 0))))  # fmt: skip
    return ClusterView((a, b, c))


def test_a_view_with_ranges_round_trips_and_a_lying_range_is_flagged() -> None:
    a = _split().nodes[0]
    assert parse_node(json.loads(json.dumps(a.as_dict())), "peer x") == a
    doc = json.loads(json.dumps(a.as_dict()))
    listed = doc["models"][0]["files"][0]["ranges"]
    listed[0].update(done=40 * MIB)  # more than the range
    listed[1].update(offset=90 * MIB)  # past the file's end
    listed[2].update(role="teleports")
    flags = parse_node(doc, "peer x").models[0].files[0].flags
    assert any("done 41943040 B of 33554432 B" in f for f in flags), flags
    assert any("ends past the file's" in f for f in flags)
    assert any("teleports" in f for f in flags)
    doc["models"][0]["files"][0]["ranges"] = [listed[0]] * 5000
    with pytest.raises(ViewError, match="ranges is not a list of at most"):
        parse_node(doc, "peer x")
    for wrong in ("all", [{"offset": "0"}], [{"offset": 0, "length": 1, "done": 0, "role": 1}]):
        doc["models"][0]["files"][0]["ranges"] = wrong
        with pytest.raises(ViewError, match="peer x"):
            parse_node(doc, "peer x")


def test_a_node_behind_on_a_range_is_told_whose_range_holds_it_back() -> None:
    cluster = _split()
    a, b, c = cluster.nodes
    assert diagnose(cluster, a, a.models[0]) == (
        f"following {C[:8]} for range [64.00 MiB, 96.00 MiB) of w (here 0%), which is itself "
        "at 0% (pulling it from the origin)"
    )
    assert diagnose(cluster, b, b.models[0]) == (
        f"following {A[:8]} for range [0 B, 32.00 MiB) of w (here 0%), which is itself "
        "at 50% (pulling it from the origin)"
    )
    assert diagnose(cluster, c, c.models[0]) == (
        f"following {D[:8]} for range [0 B, 32.00 MiB) of w, which is not in the view "
        "(gone, or unreachable)"
    )
    text = "\n".join(render(cluster))
    assert "3 ranges: 1 origin, 1 follows" in text and "3 ranges: 0 origin, 2 follows" in text
    assert "range [0 B, 32.00 MiB)" in text and f"follows {D[:8]}" in text
    assert "range [32.00 MiB, 64.00 MiB)  holds" not in text  # a range here is no row


# -- gathering the peers' views ----------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _signed(request: web.Request, body: bytes, status: int = 200) -> web.Response:
    """An answer with a true proof: the peer holds the token (and may still lie)."""
    from aioloader.swarm.proof import ANSWER_HEADER, REQUEST_HEADER, PeerProof

    proof = PeerProof(TOKEN)
    signed = proof.check_request(request.headers.get(REQUEST_HEADER), "GET", request.path_qs)
    response = web.Response(body=body, status=status, content_type="application/json")
    response.headers[ANSWER_HEADER] = proof.sign_answer(signed.nonce, status, "", body)
    return response


async def _hangs(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(30)
    return web.Response()


async def _garbage(request: web.Request) -> web.StreamResponse:
    return _signed(request, b"<html>not a view</html>")


async def _huge(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"nodes": ["')
    for _ in range(9):
        await response.write(b"x" * MIB)
    return response


async def _unproven(request: web.Request) -> web.StreamResponse:
    return web.json_response(ClusterView((_node(D, _file()),)).as_dict())


async def _lies(request: web.Request) -> web.StreamResponse:
    doc = _node(B, _file(done=200 * MIB, bytes_from_peers=-1)).as_dict()
    return _signed(request, json.dumps({"nodes": [doc], "unreachable": []}).encode())


async def _wrong_shape(request: web.Request) -> web.StreamResponse:
    return _signed(request, json.dumps({"nodes": [{"node": "zz"}]}).encode())


PEERS: dict[str, Handler] = {
    "hangs": _hangs,
    "garbage": _garbage,
    "huge": _huge,
    "unproven": _unproven,
    "lies": _lies,
    "wrong_shape": _wrong_shape,
}


@pytest.fixture
async def peers() -> AsyncIterator[dict[str, str]]:
    """Each kind of bad peer on its own port: kind -> its API address."""
    async with serving("/v1/swarm/view", list(PEERS.values())) as apis:
        yield dict(zip(PEERS, apis, strict=True))


async def test_bad_peers_are_listed_unreachable_within_the_wait_and_a_liar_flagged(
    tmp_path: Path, peers: dict[str, str]
) -> None:
    pytest.importorskip("libtorrent")
    from aioloader.swarm.coordinator import Coordinator
    from aioloader.swarm.peers import parse_peers
    from aioloader.swarm.session import Swarm

    listed = parse_peers(",".join(peers.values()))
    swarm = Swarm("127.0.0.1", 0)  # never started: a view asks it nothing
    try:
        async with Coordinator(swarm, listed, C, TOKEN, 1.0, tmp_path, "127.0.0.1:1") as node:
            started = time.monotonic()
            # Two views at once: each asks every peer, neither waits for the other.
            first, second = await asyncio.gather(
                node.cluster(node.view("127.0.0.1:9"), 1.0),
                node.cluster(node.view("127.0.0.1:9"), 1.0),
            )
            took = time.monotonic() - started
    finally:
        await swarm.aclose()
    assert took < 3.0, f"the views took {took:.1f} s with a peer that hangs"
    for cluster in (first, second):
        reasons = {u.api: u.reason for u in cluster.unreachable}
        assert "no answer within 1 s" in reasons[peers["hangs"]]
        assert "not JSON" in reasons[peers["garbage"]]
        assert "over" in reasons[peers["huge"]]
        assert "proof" in reasons[peers["unproven"]]
        assert "node is not a hex id" in reasons[peers["wrong_shape"]]
        assert [n.node for n in cluster.nodes] == [C, B]  # this node first, then the liar
        liar = cluster.nodes[1].models[0].files[0]
        assert liar.done == 200 * MIB and liar.bytes_from_peers == -1
        assert any("200%" in f for f in liar.flags)
        assert any("negative" in f for f in liar.flags)
