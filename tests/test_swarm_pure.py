"""The swarm's pure parts: rendezvous order, the peer list, a peer's manifest (which
may lie)."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import pytest

from aioloader.errors import ConfigError
from aioloader.runtime.threads import Lane
from aioloader.swarm.manifest import (
    MAX_FILE_SIZE,
    FileOffer,
    Manifest,
    ManifestError,
    check_torrent,
    file_name,
    model_key,
    parse,
    torrent_name,
)
from aioloader.swarm.peers import MAX_PEERS, PeerAddress, parse_peers, resolve
from aioloader.swarm.rendezvous import ranked, weight

# -- rendezvous ----------------------------------------------------------------------


def test_rendezvous_known_answers() -> None:
    assert weight("k", "a") == int.from_bytes(hashlib.sha256(b"a\0k").digest()[:8], "big")
    assert weight("k", "a") == 11108823027332484214
    assert ranked("k", ["a", "b", "c", "d"]) == ["c", "a", "d", "b"]
    assert ranked("model-2", ["d", "c", "b", "a", "a"]) == ["a", "d", "b", "c"]
    assert ranked("k", []) == []


def test_rendezvous_moves_only_what_the_gone_node_led() -> None:
    nodes = [f"n{i}" for i in range(8)]
    keys = [f"model-{i}" for i in range(200)]
    before = {k: ranked(k, nodes)[0] for k in keys}
    after = {k: ranked(k, nodes[1:])[0] for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == "n0"}
    assert all(after[k] == ranked(k, nodes)[1] for k in moved)  # the next in line
    assert 10 < len(moved) < 45  # n0 led about an eighth


def test_the_files_of_a_cold_split_are_dealt_out_evenly_and_alike() -> None:
    """Rendezvous hashing alone gave one node of eight four of eight shards (its links
    set the cluster's pace); the deal gives each node one, every node computes the same
    deal whatever order it names the files in, and a file routed before the deal (the
    index, read to find the shards) keeps its node."""
    from aioloader.swarm.deal import Deal

    key = model_key("s3://bucket/llm/model.safetensors.index.json")
    nodes = [f"node{i}" for i in range(8)]
    shards = [f"model-{i:05d}-of-00008.safetensors" for i in range(1, 9)]
    alone = Deal(key, "node0", nodes, {})
    assert (
        max(sum(alone.leader(s) == n for s in shards) for n in nodes) > 1
    )  # what the deal mends, for this key
    index = "model.safetensors.index.json"
    first = ranked(f"{key}/{index}", nodes)[0]
    deals = []
    for names in (shards, shards[::-1]):
        plan = Deal(key, first, nodes, {})  # the node that pulls the index: no lead
        assert plan.route(index) is None  # routed first, as the fetch reads it first
        plan.expect([index, *names])
        deals.append({s: plan.leader(s) for s in shards})
        assert plan.leader(index) == first
    assert deals[0] == deals[1]
    assert sorted(deals[0].values()) == nodes
    # Twelve files over five nodes: two or three each.
    plan = Deal(key, "node0", nodes[:5], {})
    plan.expect([f"f{i}" for i in range(12)])
    counts = [sum(plan.leader(f"f{i}") == n for i in range(12)) for n in nodes[:5]]
    assert sorted(counts) == [2, 2, 2, 3, 3]


def test_the_deal_is_a_function_of_the_answers_and_this_nodes_id() -> None:
    """Who pulls what, from plain values: a holder is followed for every file (the
    lowest id of several), with this node's share of its pieces; without one the nodes
    that answered, but those following a holder and the dead, split the files, and a
    file a node lists already (a torrent, or pulling) is followed there."""
    from aioloader.swarm.asking import Answer
    from aioloader.swarm.deal import deal
    from aioloader.swarm.manifest import FileOffer, Manifest

    key = model_key("s3://bucket/llm/model.safetensors.index.json")

    def answer(node: str, state: str | None, *files: FileOffer) -> Answer:
        swarm = f"10.0.0.{len(node)}:{6000 + int(node[-1])}"
        manifest = Manifest(key, "u", node, swarm, state, files) if state else None  # type: ignore[arg-type]
        return Answer(f"api-{node}", node, manifest, swarm)

    holders = [answer("n3", "complete"), answer("n2", "complete"), answer("n4", None)]
    whole = deal(key, "n1", holders, set())
    assert whole.whole == "n2" and whole.cohort == ["n1"] and set(whole.leads) == {"n2"}
    assert whole.route("any.safetensors") == "n2"
    # n1's share of n2's pieces among the nodes that answered: n1, n3, n4 follow n2.
    assert whole.leads["n2"].share == (0, 3)
    assert sorted(whole.leads["n2"].others) == ["10.0.0.2:6003", "10.0.0.2:6004"]
    flipped = deal(key, "n1", list(reversed(holders)), set())
    assert (flipped.whole, flipped.leads["n2"].share) == ("n2", (0, 3))
    assert sorted(flipped.leads["n2"].others) == sorted(whole.leads["n2"].others)
    # n2 dead: n3 holds it.
    assert deal(key, "n1", holders, {"n2"}).whole == "n3"

    shard = FileOffer("a.safetensors", "u/a.safetensors", 10, '"e"', info_hash="ab" * 32)
    cold = [
        answer("n2", "fetching", shard),
        answer("n3", "following"),
        answer("n4", None),
        answer("n5", "fetching"),
    ]
    split = deal(key, "n1", cold, {"n5"})
    assert split.whole is None
    assert split.cohort == ["n1", "n2", "n4"]  # the follower of a holder, the dead: out
    assert set(split.leads) == {"n2", "n4"}
    assert split.route("a.safetensors") == "n2"  # listed with its torrent there
    names = [f"model-{i}.safetensors" for i in range(6)]
    split.expect(names)
    pullers = [split.leader(n) for n in names]
    assert sorted(pullers) == ["n1", "n1", "n2", "n2", "n4", "n4"]
    again = deal(key, "n1", list(reversed(cold)), {"n5"})
    again.expect(list(reversed(names)))
    assert [again.leader(n) for n in names] == pullers
    assert [split.route(n) for n in names] == [None if p == "n1" else p for p in pullers]


# -- peers ---------------------------------------------------------------------------


def test_peers_parse() -> None:
    got = parse_peers("a:8790, 10.0.0.2:1,[::1]:9,A:8790,,svc.ns.svc.cluster.local:8790")
    assert got == [
        PeerAddress("a", 8790),
        PeerAddress("10.0.0.2", 1),
        PeerAddress("::1", 9),
        PeerAddress("svc.ns.svc.cluster.local", 8790),
    ]
    assert str(got[2]) == "[::1]:9"
    assert parse_peers(["a:1", "b:2,c:3"]) == [
        PeerAddress("a", 1), PeerAddress("b", 2), PeerAddress("c", 3)
    ]  # fmt: skip
    assert parse_peers(None) == parse_peers("") == parse_peers(" , ") == []


@pytest.mark.parametrize(
    "text, why",
    [
        ("a", "has no port"),
        (":80", "has no port"),
        ("a:0", "not 1-65535"),
        ("a:65536", "not 1-65535"),
        ("a:-1", "not 1-65535"),
        ("a:8x", "not 1-65535"),
        ("a:" + "9" * 400, "not 1-65535"),
        ("::1:80", "without brackets"),
        ("[::1]80", "no port after"),
        ("[nothost]:80", "no IPv6 address"),
        ("a b:80", "whitespace"),
        ("a\n:80", "whitespace"),
        ("a\x00:80", "control character"),
        ("http://a:80", "not a host name"),
        ("a/b:80", "not a host name"),
        ("user@a:80", "not a host name"),
        ("x" * 300 + ":80", "not a host name"),
    ],
)
def test_peers_refuse_bad_entries(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        parse_peers(f"ok:1,{text}", where="AIOLOADER_PEERS")
    assert "AIOLOADER_PEERS" in str(info.value) and "host:port" in str(info.value)


def test_peers_refuse_wrong_types_and_huge_lists() -> None:
    with pytest.raises(ConfigError, match="string"):
        parse_peers([b"a:1"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="more than"):
        parse_peers(",".join(f"h{i}:1" for i in range(MAX_PEERS + 1)))


async def test_peers_resolve_skips_names_that_do_not_resolve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    peers = parse_peers("127.0.0.5:9,localhost:7,nosuchhost.invalid:8,127.0.0.5:9")
    with Lane("test-resolve", 1) as lane:
        got = await resolve(peers, lane)
    assert got[0] == ("127.0.0.5", 9)
    assert ("127.0.0.1", 7) in got or ("::1", 7) in got
    assert all(port != 8 for _, port in got)
    assert "nosuchhost.invalid:8 does not resolve" in caplog.text
    assert len(got) == len(set(got))
    assert socket  # resolution went through getaddrinfo, not a table of our own


# -- manifest ------------------------------------------------------------------------

KEY = model_key("https://h/m/")
NODE = "ab" * 16


def _doc(**changes: object) -> dict[str, object]:
    file = {
        "name": "a.safetensors",
        "url": "https://h/m/a.safetensors",
        "size": 10,
        "etag": '"e"',
        "last_modified": None,
        "done": 10,
        "info_hash": None,
    }
    file.update(changes.pop("file", {}))  # type: ignore[call-overload]
    doc = {
        "key": KEY,
        "url": "https://h/m/",
        "node": NODE,
        "swarm": "127.0.0.9:6881",
        "state": "complete",
        "files": [file],
    }
    doc.update(changes)
    return doc


def test_model_key_is_credential_free_and_shared() -> None:
    plain = model_key("https://h/m/?versionId=3")
    assert model_key("https://user:secret@h/m/?versionId=3") == plain
    assert model_key("https://h/m/?versionId=3#frag") == plain
    assert model_key("https://h/m/?versionId=3&X-Amz-Signature=ab&X-Amz-Credential=k") == plain
    assert model_key("https://h/m/") != plain
    assert len(plain) == 64 and "secret" not in plain


@pytest.mark.parametrize(
    "one, other",
    [
        ("https://h/m/?rev=1", "https://h/m/?rev=2"),
        ("s3://b/m/?versionId=1", "s3://b/m/?versionId=2"),
        ("gs://b/m/?generation=1", "gs://b/m/?generation=2"),
        ("az://a/c/m/?snapshot=2026-01-01", "az://a/c/m/?snapshot=2026-02-01"),
    ],
)
def test_versions_of_one_model_have_keys_of_their_own(one: str, other: str) -> None:
    """A query value that picks a version keeps it apart: ``?rev=2`` was served rev 1's
    bytes from a peer when the key dropped every query value."""
    assert model_key(one) != model_key(other)


def test_files_go_by_their_path_within_the_origin() -> None:
    """``a/model.safetensors`` and ``b/model.safetensors`` were one name (the base
    name): a node asked for one received the other."""
    assert file_name("https://h/m/a.safetensors?X-Amz-Signature=s") == "m/a.safetensors"
    assert file_name("https://h/m/a/model.safetensors") != file_name(
        "https://h/m/b/model.safetensors"
    )
    assert torrent_name("m/a/model.safetensors") == "model.safetensors"


def test_a_manifest_takes_paths_but_no_way_out() -> None:
    good = _doc(file={"name": "m/a/model.safetensors"})
    assert parse(good, "p", KEY).files[0].name == "m/a/model.safetensors"
    for bad in ("m/../x", "/abs", "m//x", "m/./x", "a\\b", "x" * 256 + "/y", "m/" * 600):
        with pytest.raises(ManifestError):
            parse(_doc(file={"name": bad}), "p", KEY)


def test_manifest_round_trip_never_shows_credentials() -> None:
    secret = "https://user:hunter2@h/m/a.safetensors?X-Amz-Signature=topsecret"
    manifest = Manifest(KEY, "https://u:hunter2@h/m/?token=topsecret", NODE, "127.0.0.9:1")
    digest = "ab" * 32
    offer = FileOffer("a.safetensors", secret, 10, torrent=b"t" * 100_000, info_hash=digest)
    manifest = manifest.with_file(offer)
    text = json.dumps(manifest.as_dict())
    assert "hunter2" not in text and "topsecret" not in text
    assert len(text) < 1000  # the torrent is named by its hash, not sent each time
    back = parse(json.loads(text), "p", KEY)
    assert back.files[0].info_hash == digest and back.files[0].size == 10
    assert back.files[0].torrent is None
    assert back.state == "following" and back.file("a.safetensors") is not None


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"key": "0" * 64}, "not " + KEY),
        ({"key": 5}, "key is not a string"),
        ({"node": "not hex!"}, "node is not a hex id"),
        ({"node": ""}, "node is not a hex id"),
        ({"state": "done"}, "not fetching, following or complete"),
        ({"state": None}, "not fetching, following"),
        ({"swarm": "host:1"}, "not ip:port"),
        ({"swarm": "127.0.0.1:0"}, "not ip:port"),
        ({"swarm": ["127.0.0.1", 1]}, "swarm is not a string"),
        ({"files": {}}, "files is not a list"),
        ({"files": [1]}, "files\\[0\\] is not an object"),
        ({"url": "x" * 5000}, "url is not a string of at most"),
        ({"file": {"size": -1}}, "size is not an integer"),
        ({"file": {"size": True}}, "size is not an integer"),
        ({"file": {"size": 1.5}}, "size is not an integer"),
        ({"file": {"size": "10"}}, "size is not an integer"),
        ({"file": {"size": MAX_FILE_SIZE + 1}}, "size is not an integer"),
        ({"file": {"done": 11}}, "done is not an integer from 0 to 10"),
        ({"file": {"name": ".."}}, "not a relative path of plain names"),
        ({"file": {"name": "../../etc/passwd"}}, "not a relative path of plain names"),
        ({"file": {"name": "a//b"}}, "not a relative path of plain names"),
        ({"file": {"name": "a\\b"}}, "not a relative path of plain names"),
        ({"file": {"name": ""}}, "not a relative path of plain names"),
        ({"file": {"name": "a\x00b"}}, "control character"),
        ({"file": {"name": 3}}, "name is not a string"),
        ({"file": {"etag": 3}}, "etag is not a string"),
        ({"file": {"info_hash": "!!" * 32}}, "not a v2 info hash"),
        ({"file": {"info_hash": 12}}, "not a v2 info hash"),
        ({"file": {"info_hash": "ab" * 16}}, "not a v2 info hash"),
    ],
)
def test_manifest_refuses_a_lying_peer(changes: dict[str, object], why: str) -> None:
    with pytest.raises(ManifestError, match=why) as info:
        parse(_doc(**changes), "10.0.0.7:8790", KEY)
    assert "peer 10.0.0.7:8790" in str(info.value)


def test_manifest_refuses_non_objects_and_twice_named_files() -> None:
    for doc in (None, [], "x", 3):
        with pytest.raises(ManifestError, match="not a JSON object"):
            parse(doc, "p", KEY)
    doc = _doc()
    doc["files"] = doc["files"] * 2  # type: ignore[operator]
    with pytest.raises(ManifestError, match="names a file twice"):
        parse(doc, "p", KEY)


def test_manifest_checks_each_torrent_against_its_file(tmp_path: Path) -> None:
    torrents = pytest.importorskip("aioloader.swarm.torrents")
    pytest.importorskip("libtorrent")
    path = tmp_path / "data"
    path.write_bytes(bytes(range(256)) * 40)
    good = torrents.make_torrent(path, "a.safetensors")
    assert torrents.describe(good) == ("a.safetensors", 10240)
    assert len(torrents.info_hash(good)) == 64

    def offer(
        size: int = 10240, name: str = "a.safetensors", digest: str | None = None
    ) -> FileOffer:
        return FileOffer(name, "u", size, info_hash=digest or torrents.info_hash(good))

    def check(raw: bytes, of: FileOffer) -> bytes:
        return check_torrent(raw, of, torrents.describe, torrents.info_hash)  # type: ignore[no-any-return]

    assert check(good, offer()) == good
    with pytest.raises(ManifestError, match="describes 10240 bytes, the manifest says 10"):
        check(good, offer(size=10))
    with pytest.raises(ManifestError, match=r"describes a file 'a\.safetensors'"):
        check(good, offer(name="m/b.safetensors"))
    assert check(good, offer(name="m/a.safetensors")) == good  # named by its path
    with pytest.raises(ManifestError, match="has the info hash"):
        check(good, offer(digest="cd" * 32))
    with pytest.raises(ManifestError, match="not a usable torrent"):
        check(b"d4:junk3:xyze", offer())
    with pytest.raises(ManifestError, match="not a usable torrent"):
        check(good[: len(good) // 2], offer())
