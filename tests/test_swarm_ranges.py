"""A large file dealt in byte ranges among the pullers of a cold split (ranges.py,
ranged.py): the deal itself over plain values, a peer's ranges checked, and real
`aioloader serve` daemons on 127.0.0.x pulling a one-file model through every node's
link to the origin."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aioloader.swarm.manifest import ManifestError, model_key, parse
from aioloader.swarm.proof import ANSWER_HEADER, REQUEST_HEADER, PeerProof
from aioloader.swarm.pulling import CHUNK, sized
from aioloader.swarm.range_torrents import make_range_torrent
from aioloader.swarm.ranges import MAX_RANGE, PIECE, RANGED_FROM, adopted, owner, spans
from aioloader.swarm.torrents import info_hash

from .daemon_helpers import TOKEN, free_port, single_file
from .http_server import FaultyHttpServer
from .test_swarm_daemon import Node

pytest.importorskip("libtorrent")

MiB = 1 << 20


def test_a_small_file_stays_whole_and_a_large_one_is_cut_by_the_pullers() -> None:
    assert spans(RANGED_FROM - 1, 8) == [(0, RANGED_FROM - 1)]
    got = spans(96 * MiB + 5, 3)  # 97 pieces, the last of 5 bytes
    assert [length for _, length in got] == [33 * MiB, 32 * MiB, 31 * MiB + 5]
    assert all(offset % PIECE == 0 for offset, _ in got)
    assert sum(length for _, length in got) == 96 * MiB + 5
    big = spans(10 << 30, 4)  # 10 GiB on 4: ranges of 256 MiB at most
    assert max(length for _, length in big) == MAX_RANGE
    assert big[-1][0] + big[-1][1] == 10 << 30


@pytest.mark.parametrize(
    ("size", "pullers"),
    [
        (128 * MiB + 1040, 32),
        (64 * MiB, 32),
        (1 << 30, 8),
        (3 * MiB + 64 * MiB, 5),
        (70 * MiB, 100),
    ],
)
def test_every_puller_gets_a_range_within_a_piece_of_the_others(size: int, pullers: int) -> None:
    # A 128 MiB file (and its header) on 32 pullers: each one's share, 4 MiB and 1040
    # bytes, rounded up to the 1 MiB piece gave 26 ranges of 5 MiB, and 6 of the 32
    # origin links had nothing to pull.
    got = spans(size, pullers)
    pieces = -(-size // PIECE)
    assert len(got) == min(pullers, pieces)
    assert all(offset % PIECE == 0 for offset, _ in got)
    assert [offset for offset, _ in got] == [0] + [o + n for o, n in got[:-1]]
    assert got[-1][0] + got[-1][1] == size
    whole = [-(-length // PIECE) for _, length in got]
    assert max(whole) - min(whole) <= 1


def test_every_node_deals_alike_and_a_gone_puller_s_ranges_go_to_the_others() -> None:
    pullers = ["a1", "b2", "c3"]
    owners = [owner("k", "f", 6, i, pullers, set()) for i in range(6)]
    assert sorted(owners) == sorted(pullers * 2)  # two ranges each
    again = [owner("k", "f", 6, i, list(reversed(pullers)), set()) for i in range(6)]
    assert again == owners  # the ranking, not the order given, decides
    gone = owners[0]
    after = [owner("k", "f", 6, i, pullers, {gone}) for i in range(6)]
    for before, now in zip(owners, after, strict=True):
        assert now == before if before != gone else now != gone
    left = [now for before, now in zip(owners, after, strict=True) if before == gone]
    assert len(set(left)) == 2  # its two ranges go to two survivors
    assert owner("k", "f", 6, 0, pullers, set(pullers)) == ""


def test_weight_files_as_many_as_the_pullers_are_dealt_whole_fewer_cut_round_all_pullers() -> None:
    """8 shards on 8 nodes: whole files (a torrent a file); 3 shards on 8 nodes: each cut
    in 3, and the 9 ranges go round all 8 pullers (before: each file's ranges went to the
    first 3 of its own ranking, so some nodes pulled 2 and others nothing)."""
    from aioloader.swarm.deal import Deal

    nodes = [f"{i:02x}" * 16 for i in range(8)]
    shards = [f"m/model-0000{i}-of-00008.safetensors" for i in range(1, 9)]
    whole = Deal("k", nodes[0], nodes, {})
    whole.expect([*shards, "m/model.safetensors.index.json"])
    assert whole.ranged() is None
    three = Deal("k", nodes[0], nodes, {})
    three.expect(shards[:3])
    assert three.ranged() == sorted(nodes) and three.cuts() == 3
    owners = [
        owner("k", name, 3, i, nodes, set(), three.start(name)) for name in shards[:3]
        for i in range(3)
    ]  # fmt: skip
    assert set(owners) == set(nodes) and max(owners.count(n) for n in nodes) == 2
    one = Deal("k", nodes[0], nodes, {})
    one.expect(["m/w.safetensors"])
    assert one.cuts() == 8 and one.start("m/w.safetensors") == 0
    # A puller gone: its ranges of every file go to the others, in turn, alike everywhere.
    gone = owners[0]
    after = [
        owner("k", name, 3, i, nodes, {gone}, three.start(name)) for name in shards[:3]
        for i in range(3)
    ]  # fmt: skip
    assert gone not in after
    assert [a for a, b in zip(after, owners, strict=True) if b != gone] == [
        b for b in owners if b != gone
    ]


def test_a_split_under_way_keeps_the_ranges_listed_and_cuts_the_gaps() -> None:
    size = 3 * MAX_RANGE + 5
    listed = [(MAX_RANGE, 10 * PIECE), (MAX_RANGE + 5 * PIECE, PIECE)]  # the second overlaps
    got = adopted(listed, size)
    assert got[:2] == [(0, MAX_RANGE), (MAX_RANGE, 10 * PIECE)]
    assert (MAX_RANGE + 5 * PIECE, PIECE) not in got
    assert all(0 < n <= MAX_RANGE for _, n in got)
    assert [o for o, _ in got] == sorted(o for o, _ in got)
    assert sum(n for _, n in got) == size and got[-1][0] + got[-1][1] == size


def test_nodes_that_heard_different_answers_deal_one_split() -> None:
    """32 nodes on two vCPUs: each counted the answers it had in time, cut one file by its
    own count and dealt its ranges to owners who cut it otherwise; each read what its
    owner did not list from the origin: 32 copies. Now the first split published is
    everyone's: the same pullers, cut and owner for every range on every node."""
    from aioloader.swarm.asking import Answer
    from aioloader.swarm.deal import deal
    from aioloader.swarm.manifest import Manifest

    nodes = [f"{i:02x}" * 16 for i in range(32)]
    key, name = "k" * 64, "m/model.safetensors"

    def answer(node: str, state: str | None = None, split: tuple[str, ...] = ()) -> Answer:
        manifest = Manifest(key, "u", node, "10.0.0.1:1", state, split=split) if state else None  # type: ignore[arg-type]
        return Answer(f"api-{node}", node, manifest, "10.0.0.1:1")

    def cut(dealt: object) -> list[tuple[int, int, str]]:
        dealt.expect([name])  # type: ignore[attr-defined]
        pullers = dealt.ranged()  # type: ignore[attr-defined]
        assert pullers is not None
        got = spans(1 << 30, dealt.cuts())  # type: ignore[attr-defined]
        return [
            (offset, length, owner(key, name, len(got), i, pullers, set()))
            for i, (offset, length) in enumerate(got)
        ]

    # The first dealer heard 29 others in time.
    first = deal(key, nodes[0], [answer(n) for n in nodes[1:30]], set())
    split = tuple(sorted(first.pullers or first.cohort))
    assert len(split) == 30
    # Another heard all 31 others, the first among them, its split published.
    heard = [answer(nodes[0], "fetching", split)] + [answer(n) for n in nodes[1:] if n != nodes[5]]
    other = deal(key, nodes[5], heard, set())
    assert other.pullers == list(split)
    assert cut(other) == cut(first)
    # A node left out of the split (it was not heard in time) pulls nothing.
    late = deal(key, nodes[31], heard[:-1], set())
    assert nodes[31] not in (late.ranged() or [])
    assert nodes[31] not in {who for *_, who in cut(late)}
    # Two splits published (two nodes dealt at once): the longest, then the first in
    # node order, whatever order the answers came in; a node's own deal is kept.
    shorter = tuple(nodes[:20])
    rival = tuple(nodes[2:32])
    both = [answer(nodes[1], "fetching", rival), answer(nodes[0], "fetching", split),
            answer(nodes[3], "fetching", shorter)]  # fmt: skip
    assert deal(key, nodes[9], both, set()).pullers == list(split)
    assert deal(key, nodes[9], both[::-1], set()).pullers == list(split)
    assert deal(key, nodes[9], both, set(), agreed=rival).pullers == list(rival)
    # Published by a node following a holder, or by none: not a split.
    assert deal(key, nodes[9], [answer(nodes[0], "following", split)], set()).pullers is None


def test_nodes_that_dealt_at_once_cut_a_file_alike() -> None:
    """Eight of 32 nodes dealt before any split was published, each by the 25 to 30
    nodes it had heard, and kept its cut: a range of one cut was listed by no node of
    another, and each read what nobody listed from the origin (22 to 32 copies of one
    file). The cut follows the cluster as configured, so the offsets agree whoever
    pulls; a node follows the range where it is listed (ranged.py)."""
    from aioloader.swarm.asking import Answer
    from aioloader.swarm.deal import deal

    nodes = [f"{i:02x}" * 16 for i in range(32)]
    key, name, size = "k" * 64, "m/model.safetensors", 128 * MiB

    def cut(me: int, heard: int) -> list[tuple[int, int]]:
        others = [n for n in nodes[:heard] if n != nodes[me]]
        answers = [Answer(f"api-{n}", n, None, "10.0.0.1:1") for n in others]
        dealt = deal(key, nodes[me], answers, set(), cap=60, cluster=32)
        dealt.expect([name])
        assert dealt.ranged() is not None
        return spans(size, dealt.cuts())

    cuts = {tuple(cut(me, heard)) for me, heard in [(0, 25), (1, 28), (2, 30), (3, 32)]}
    assert len(cuts) == 1, [len(c) for c in cuts]
    (one,) = cuts
    assert len(one) == 32 and sum(n for _, n in one) == size


def test_a_dead_puller_of_the_agreed_split_gets_no_whole_file() -> None:
    """The split stays the same on every try; a puller dropped (dead) is dealt no whole
    file (it would be followed for it), and its ranges go to the others (ranges.py)."""
    from aioloader.swarm.asking import Answer
    from aioloader.swarm.deal import deal
    from aioloader.swarm.manifest import Manifest

    key = "k" * 64
    nodes = ["aa", "bb", "cc"]
    answers = [
        Answer(f"api-{n}", n, Manifest(key, "u", n, "10.0.0.1:1", "fetching", split=tuple(nodes)))
        for n in nodes[1:]
    ]
    dealt = deal(key, "aa", answers, {"bb"}, agreed=tuple(nodes))
    assert dealt.pullers == nodes
    names = [f"model-{i}.safetensors" for i in range(6)]
    dealt.expect(names)
    assert {dealt.leader(n) for n in names} == {"aa", "cc"}


@pytest.mark.parametrize(
    ("split", "says"),
    [
        ("aa", "split is not a list"),
        ([], "split is not a list"),
        (["aa"] * 5000, "split is not a list"),
        ([1], r"split\[0\] is not a node id"),
        (["zz"], r"split\[0\] is not a node id"),
        (["a" * 65], r"split\[0\] is not a node id"),
        (["bb", "aa"], "not in node order"),
        (["aa", "aa"], "names a node twice"),
    ],
)
def test_a_peer_lying_about_its_split_is_refused(split: object, says: str) -> None:
    doc = _manifest([]) | {"split": split}
    with pytest.raises(ManifestError, match=says):
        parse(doc, "peer 10.0.0.9", "k" * 64)
    assert parse(_manifest([]) | {"split": ["aa", "bb"]}, "p", "k" * 64).split == ("aa", "bb")


def _manifest(ranges: object, size: int = 96 * MiB) -> dict[str, object]:
    offer = {"name": "m/w.safetensors", "url": "http://o/m/w.safetensors", "size": size}
    offer["ranges"] = ranges
    return {
        "key": "k" * 64, "url": "http://o/m/w.safetensors", "node": "ab12",
        "swarm": "127.0.0.1:6881", "state": "fetching", "files": [offer],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("ranges", "says"),
    [
        ([{"offset": 0, "length": 40 * MiB}, {"offset": 32 * MiB, "length": MiB}], "overlap"),
        ([{"offset": 90 * MiB, "length": 7 * MiB}], "length is not an integer"),
        ([{"offset": 97 * MiB, "length": 1}], "offset is not an integer"),
        ([{"offset": 0, "length": 0}], "is empty"),
        ([{"offset": 0, "length": MiB, "done": 2 * MiB}], "done is not an integer"),
        ([{"offset": "0", "length": MiB}], "offset is not an integer"),
        ([{"offset": 0, "length": MiB, "info_hash": "zz"}], "info_hash"),
        ([{"offset": i, "length": 1} for i in range(5000)], "at most 4096"),
        ({"offset": 0}, "is not a list"),
        ([{"offset": 0, "length": MiB, "done": MiB, "info_hash": "a" * 64, "held": 1}], "held"),
        ([{"offset": 0, "length": MiB, "done": MiB, "held": True}], "without its info hash"),
        (
            [{"offset": 0, "length": MiB, "done": 2 * MiB, "info_hash": "a" * 64, "held": True}],
            "done is not an integer",
        ),
    ],
)
def test_a_peer_lying_about_its_ranges_is_refused(ranges: object, says: str) -> None:
    with pytest.raises(ManifestError, match=says) as caught:
        parse(_manifest(ranges), "peer 10.0.0.9", "k" * 64)
    assert "peer 10.0.0.9" in str(caught.value)


def test_a_peer_s_true_ranges_are_read() -> None:
    ranges = [{"offset": 0, "length": 33 * MiB, "done": MiB, "info_hash": "a" * 64}]
    got = parse(_manifest(ranges), "peer", "k" * 64)
    (one,) = got.files[0].ranges
    assert (one.offset, one.length, one.done, one.info_hash) == (0, 33 * MiB, MiB, "a" * 64)
    assert not one.held


def test_a_range_held_whole_is_read_as_held_and_written_back_alike() -> None:
    """A node lists a range it downloads from a peer as ``held`` (splits.py), whole or
    on its way: parsed, and written back the same; a range it pulls says nothing of it."""
    ranges = [
        {"offset": 0, "length": 33 * MiB, "done": 33 * MiB, "info_hash": "a" * 64, "held": True},
        {"offset": 33 * MiB, "length": MiB, "done": 0, "info_hash": None},
        {"offset": 34 * MiB, "length": MiB, "done": 0, "info_hash": "b" * 64, "held": True},
    ]
    got = parse(_manifest(ranges), "peer", "k" * 64).files[0].ranges
    assert [one.held for one in got] == [True, False, True]
    assert [one.as_dict() for one in got] == ranges


def _fleet(tmp_path: Path, first: int, count: int, *args: str) -> list[Node]:
    hosts = [first + i for i in range(count)]
    ports = [free_port(f"127.0.0.{n}") for n in hosts]
    peers = ",".join(f"127.0.0.{n}:{p}" for n, p in zip(hosts, ports, strict=True))
    nodes = []
    for n, port in zip(hosts, ports, strict=True):
        node = Node(tmp_path, n, peers, *args)
        node.port = port
        nodes.append(node)
    return nodes


def _fetched(nodes: list[Node], url: str, seconds: float) -> list[dict[str, object]]:
    """Start ``nodes``, ask each for the model at ``url``; each one's record once ready
    (the caller stops them: ``_stopping``)."""
    for node in nodes:
        node.start()
    for node in nodes:
        status, body = node.post({"url": url, "id": "m"})
        assert status in (200, 202), (status, body)
    return [node.wait_status("m", "ready", seconds) for node in nodes]


@contextlib.contextmanager
def _stopping(nodes: list[Node]) -> Iterator[list[Node]]:
    try:
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _read_unpublished(node: Node, key: str) -> int | None:
    """The bytes ``node`` read of its ranges not yet published, as its manifest says
    (None: it lists none)."""
    status, manifest = node.get(f"/v1/swarm/models/{key}")
    if status != 200:
        return None
    ranges = [r for f in manifest["files"] for r in f.get("ranges", ())]
    unpublished = [r["done"] for r in ranges if r["info_hash"] is None]
    return sum(unpublished) if unpublished else None


def _data(record: dict[str, object]) -> bytes:
    return Path(str(record["path"])).read_bytes()


@pytest.mark.parametrize("count", [3, 4])
def test_a_one_file_model_comes_through_every_node_s_origin_link(
    tmp_path: Path, http_server: FaultyHttpServer, count: int
) -> None:
    file = single_file(http_server.root / "m" / "w.safetensors", kib=96 * 1024)
    url = http_server.url_for("m/w.safetensors")
    size = file.stat().st_size
    nodes = _fleet(tmp_path, 141 + 10 * (count - 3), count)
    with _stopping(nodes):
        records = _fetched(nodes, url, 120)
        pulled = [int(str(r["bytes_from_origin"])) for r in records]
        sent = http_server.bytes_sent
        print(f"{count} nodes, {size} bytes: origin sent {sent}, per node {pulled}")
        assert all(p > 0 for p in pulled), pulled
        assert sum(pulled) == size, (pulled, size)  # each byte read once
        # Each node opens the file with its first byte only: its probe's 256 KiB (the
        # header, which a puller of another range never reads) were sent to every node.
        assert sent <= size + count * 4096, (sent, size)
        want = file.read_bytes()
        for record in records:
            assert _data(record) == want


def test_pullers_behind_a_slow_origin_are_seen_moving_and_followed(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """The origin sends 1 MiB a second a request (a throttling CDN), so a puller's read
    of 8 MiB took 8 s: its manifest showed nothing moving for longer than the followers'
    stall time (5 s here), and each follower read the range from the origin itself (3
    copies of the file). Reads are sized to the rate now (swarm/pulling.py): the bytes
    read show every 2 s or so, and each range leaves the origin once."""
    file = single_file(http_server.root / "m" / "w.safetensors", kib=96 * 1024)
    url = http_server.url_for("m/w.safetensors")
    size = file.stat().st_size
    http_server.pace("m/w.safetensors", MiB, count=10_000)
    nodes = _fleet(tmp_path, 234, 3, "--swarm-stall", "5")
    with _stopping(nodes):
        records = _fetched(nodes, url, 180)
        sent = http_server.bytes_sent
        logs = [node.log.read_text() for node in nodes]
        print(f"paced origin: sent {sent} of {size}")
        assert not any("read from the origin here" in log for log in logs)
        assert sent <= 1.02 * size, (sent, size)
        want = file.read_bytes()
        for record in records:
            assert _data(record) == want


def test_a_read_is_sized_to_show_progress_every_two_seconds() -> None:
    assert sized(MiB, 0.01) == CHUNK  # fast: the largest read
    assert sized(MiB, 2.0) == MiB  # 0.5 MiB/s: 1 MiB in 2 s
    assert sized(MiB, 4.0) == 512 << 10
    assert sized(MiB, 3600.0) == 256 << 10  # however slow, 256 KiB
    assert sized(3 * MiB, 2.0) == 2 * MiB  # a power of two, not over the rate
    assert sized(MiB, 0.0) == CHUNK


def test_a_puller_killed_mid_pull_costs_only_its_unpublished_ranges(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """Four nodes, a 96 MiB file whose origin sends 2 MiB of every request, then pauses
    a second: one node is killed while its reads of its range are in flight (listed,
    not published); the three others deal its range again and finish, bit-identical,
    the origin sending little more than one copy. (A puller's loss is what it had in
    flight: up to its range, four 8 MiB reads at a time.)"""
    file = single_file(http_server.root / "m" / "w.safetensors", kib=96 * 1024)
    url = http_server.url_for("m/w.safetensors")
    size = file.stat().st_size
    http_server.stall("m/w.safetensors", 1.0, after_bytes=2 * MiB, count=1000)
    nodes = _fleet(tmp_path, 161, 4)
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            status, body = node.post({"url": url, "id": "m"})
            assert status in (200, 202), (status, body)
        victim = nodes[0]
        deadline = time.monotonic() + 60
        while _read_unpublished(victim, model_key(url)) is None:
            assert time.monotonic() < deadline, "the victim never started a range"
            time.sleep(0.05)
        victim.kill()
        survivors = nodes[1:]
        records = [node.wait_status("m", "ready", 180) for node in survivors]
        pulled = [int(str(r["bytes_from_origin"])) for r in records]
        print(f"killed: origin sent {http_server.bytes_sent} of {size}, survivors {pulled}")
        assert http_server.bytes_sent <= 1.15 * size, (http_server.bytes_sent, size)
        want = file.read_bytes()
        for record in records:
            assert _data(record) == want
    finally:
        for node in nodes:
            node.stop()


class _LyingPuller:
    """A peer that proves the token, says it pulls the model, and lists ranges of the
    file as ``ranges(key)`` gives them; its torrent route serves ``torrent``."""

    def __init__(self, offer: dict[str, object], ranges: object, torrent: bytes) -> None:
        self.proof = PeerProof(TOKEN)
        liar = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                header = self.headers.get(REQUEST_HEADER, "")
                nonce = header.split("nonce=")[-1].split(";")[0].strip()
                key = self.path.rsplit("/", 1)[-1]
                if "/torrents/" in self.path:
                    body, kind = torrent, "application/x-bittorrent"
                else:
                    body, kind = json.dumps(liar.manifest(key)).encode(), "application/json"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                if nonce:
                    self.send_header(ANSWER_HEADER, liar.proof.sign_answer(nonce, 200, "", body))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)  # a torrent refused may close it first

        self.offer, self.ranges = offer, ranges
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def manifest(self, key: str) -> dict[str, object]:
        offer = dict(self.offer, ranges=self.ranges)
        return {"key": key, "url": "x", "node": "ee" * 16, "swarm": "127.0.0.1:9",
                "state": "fetching", "files": [offer]}  # fmt: skip

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("lie", ["overlap", "outside", "another size", "held, another size"])
def test_a_peer_lying_about_a_range_is_left_and_the_others_finish(
    tmp_path: Path, http_server: FaultyHttpServer, lie: str
) -> None:
    """A proven peer says it pulls the file and lists ranges that overlap, ranges past
    the file's end (its manifest is refused whole), or ranges whose torrents describe a
    file of another size, as their puller or as a node that holds them whole (each
    refused, the peer left, its ranges dealt again): the three real nodes finish,
    bit-identical, the origin sending about one copy."""
    file = single_file(http_server.root / "m" / "w.safetensors", kib=96 * 1024)
    url = http_server.url_for("m/w.safetensors")
    size = file.stat().st_size
    st = file.stat()
    offer = {"name": "m/w.safetensors", "url": url, "size": size,
             "etag": f'"{st.st_size:x}-{st.st_mtime_ns:x}"', "last_modified": None}  # fmt: skip
    other = tmp_path / "other" / "w.safetensors"
    other.parent.mkdir()
    with open(other, "wb") as out:
        out.truncate(size + PIECE)
    cuts = spans(size, 4)
    torrent = make_range_torrent(other, 0, cuts[0][1], size + PIECE, "w.safetensors", PIECE)
    digest = info_hash(torrent)
    if lie == "overlap":
        ranges: object = [{"offset": 0, "length": 40 * MiB}, {"offset": 32 * MiB, "length": MiB}]
    elif lie == "outside":
        ranges = [{"offset": size - MiB, "length": 2 * MiB}]
    else:
        ranges = [{"offset": o, "length": n, "done": n, "info_hash": digest} for o, n in cuts]
        if lie == "held, another size":  # it says it downloaded every range, whole
            ranges = [dict(r, held=True) for r in ranges]
    liar = _LyingPuller(offer, ranges, torrent)
    lies = ["overlap", "outside", "another size", "held, another size"]
    nodes = _fleet(tmp_path, 171 + 4 * lies.index(lie), 3)
    for node in nodes:
        node.args[node.args.index("--peers") + 1] += f",{liar.address}"
    try:
        with _stopping(nodes):
            records = _fetched(nodes, url, 120)
            sent = http_server.bytes_sent
            print(f"{lie}: origin sent {sent} of {size}")
            assert sent <= 1.05 * size, (sent, size)
            want = file.read_bytes()
            for record in records:
                assert _data(record) == want
            logs = "".join(node.output() for node in nodes)
            said = {"overlap": "ranges overlap", "outside": "length is not an integer",
                    "another size": "not that range of",
                    "held, another size": "not that range of"}[lie]  # fmt: skip
            assert said in logs, logs[-4000:]
    finally:
        liar.close()


def test_a_node_that_joins_a_split_under_way_follows_the_ranges_listed(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """Three nodes split a 96 MiB file (the origin pauses a second at every request);
    a fourth starts and joins once they list their ranges: it deals nothing of its own (four
    pullers would cut other ranges), follows each range where it is listed, and the
    origin sends about one copy."""
    file = single_file(http_server.root / "m" / "w.safetensors", kib=96 * 1024)
    url = http_server.url_for("m/w.safetensors")
    size = file.stat().st_size
    http_server.stall("m/w.safetensors", 1.0, count=1000)
    nodes = _fleet(tmp_path, 191, 4)
    first, late = nodes[:3], nodes[3]
    try:
        for node in first:
            node.start()
        for node in first:
            status, body = node.post({"url": url, "id": "m"})
            assert status in (200, 202), (status, body)
        deadline = time.monotonic() + 60
        while not all(_listed(node, model_key(url)) for node in first):
            assert time.monotonic() < deadline, "the nodes never listed their ranges"
            time.sleep(0.05)
        late.start()
        status, body = late.post({"url": url, "id": "m"})
        assert status in (200, 202), (status, body)
        records = [node.wait_status("m", "ready", 120) for node in nodes]
        pulled = [int(str(r["bytes_from_origin"])) for r in records]
        sent = http_server.bytes_sent
        print(f"late joiner: origin sent {sent} of {size}, per node {pulled}")
        assert pulled[3] <= 1 << 20, pulled  # the header it read to plan, no range
        assert sent <= 1.02 * size, (sent, size)
        want = file.read_bytes()
        for record in records:
            assert _data(record) == want
    finally:
        for node in nodes:
            node.stop()


def _listed(node: Node, key: str) -> bool:
    status, manifest = node.get(f"/v1/swarm/models/{key}")
    return status == 200 and any(f.get("ranges") for f in manifest["files"])


def test_the_ranges_keep_to_the_cluster_s_cap_on_requests_in_flight(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    """Three nodes, a cap of 3 for the cluster: each reads its range one 8 MiB request
    at a time (its share), though a range may have four reads in flight."""
    file = single_file(http_server.root / "m" / "w.safetensors", kib=96 * 1024)
    url = http_server.url_for("m/w.safetensors")
    size = file.stat().st_size
    nodes = _fleet(tmp_path, 211, 3, "--swarm-origin-requests", "3")
    with _stopping(nodes):
        records = _fetched(nodes, url, 120)
        assert http_server.max_concurrent <= 3, http_server.max_concurrent
        assert http_server.bytes_sent <= 1.02 * size
        want = file.read_bytes()
        for record in records:
            assert _data(record) == want
