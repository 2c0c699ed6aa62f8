"""Gentle with the origin: the cluster's cap on requests in flight, shared out by the
deal, and a throttling answer to one node slowing every node (swarm/gentle.py,
runtime/throttle.py ``Origin``). The daemons' side runs in test_swarm_gentle_fleet.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time

import pytest

from aioloader.errors import ConfigError
from aioloader.runtime.throttle import MAX_TOLD_PAUSE, AdaptiveLimiter, origin, origin_name
from aioloader.settings.options import LoadOptions
from aioloader.settings.values import Limits
from aioloader.swarm.asking import Answer
from aioloader.swarm.deal import deal
from aioloader.swarm.gentle import LEAD_CHUNK, Heard, leading
from aioloader.swarm.manifest import Manifest, ManifestError, Throttled, model_key, parse

_names = itertools.count()


def fresh_origin() -> str:
    """An origin no other test has used (the registry is the process's)."""
    return f"https://origin-{next(_names)}.test"


# -- the origin every limiter of it shares ----------------------------------------------


def test_origin_name_is_scheme_host_and_port() -> None:
    assert origin_name("https://User:pw@Host.Example:8443/a/b?x=1") == "https://host.example:8443"
    assert origin_name("HTTP://host/a") == "http://host"
    assert origin_name("s3://bucket/key") == "s3://bucket"
    assert origin_name("not a url") == "not a url"
    assert origin_name("http://[::1]:99/x") == "http://::1:99"


async def test_a_throttle_on_one_limiter_halves_and_pauses_the_others_of_its_origin() -> None:
    name = fresh_origin()
    first, second = AdaptiveLimiter(8), AdaptiveLimiter(8)
    first.bind(origin(name))
    second.bind(origin(name))
    ticket = await first.acquire()
    assert first.on_throttle(0.3, ticket) is False
    first.release()
    assert first.statistics().limit == 4
    # Its own answer is not heeded twice: the next acquire leaves the limit at 4.
    started = time.monotonic()
    await first.acquire()
    first.release()
    assert first.statistics().limit == 4
    assert time.monotonic() - started >= 0.25, "the pause was not waited out"
    # The other limiter of the origin halves on its next acquire, and waits out the pause.
    assert second.statistics().limit == 8
    await second.acquire()
    second.release()
    assert second.statistics().limit == 4
    assert origin(name).throttled == 1 and origin(name).signals == 1


async def test_told_signals_pause_and_halve_but_are_not_this_nodes_own() -> None:
    shared = origin(fresh_origin())
    limiter = AdaptiveLimiter(16, shared)
    shared.told(0.3)
    started = time.monotonic()
    await limiter.acquire()
    limiter.release()
    assert time.monotonic() - started >= 0.25
    assert limiter.statistics().limit == 8
    assert shared.throttled == 0, "a signal told by a peer is published as this node's"
    shared.told(1e12)  # a peer that lies: a minute at most
    assert shared.resume_in() <= MAX_TOLD_PAUSE
    shared.told(-5)
    shared.told(math.nan)  # neither moves the pause back nor breaks it
    assert 0 < shared.resume_in() <= MAX_TOLD_PAUSE


def test_heard_heeds_a_count_that_grew_once() -> None:
    name = fresh_origin()
    heard = Heard()
    shared = origin(name)
    heard.heed("a" * 32, (Throttled(name, 3, 0.0),))
    assert shared.signals == 0, "an old count, its pause over, is where the peer stands"
    heard.heed("a" * 32, (Throttled(name, 3, 0.0),))
    assert shared.signals == 0
    heard.heed("a" * 32, (Throttled(name, 4, 0.0),))
    assert shared.signals == 1
    heard.heed("a" * 32, (Throttled(name, 4, 5.0),))
    assert shared.signals == 1, "the same answer, asked again, counted twice"
    heard.heed("b" * 32, (Throttled(name, 1, 2.0),))  # another node, still pausing
    assert shared.signals == 2 and shared.resume_in() > 1.0


# -- the deal shares the cap out --------------------------------------------------------


def _answers(key: str, nodes: list[str], caps: dict[str, int | None]) -> list[Answer]:
    return [
        Answer(
            f"api-{n}",
            n,
            Manifest(key, "u", n, f"10.0.0.{i + 1}:6881", "fetching", origin_requests=caps.get(n)),
            f"10.0.0.{i + 1}:6881",
        )
        for i, n in enumerate(nodes)
    ]


def test_the_deal_keeps_the_pullers_within_the_lowest_cap_and_every_node_agrees() -> None:
    key = model_key("https://origin.test/llm/model.safetensors")
    nodes = [f"{i:02x}" * 16 for i in range(8)]
    files = ["model.safetensors", "a.safetensors", "b.safetensors", "c.safetensors"]
    caps: dict[str, int | None] = {n: 64 for n in nodes}
    caps[nodes[5]] = 3  # one node configured lower: its cap holds for all
    deals = []
    for me in nodes:
        others = [n for n in nodes if n != me]
        dealt = deal(key, me, _answers(key, others, caps), set(), caps[me])
        dealt.expect(files)
        deals.append(dealt)
    for dealt in deals:
        assert dealt.pullers == deals[0].pullers and dealt.share == 1
        assert len(dealt.pullers or []) == 3
        assert [dealt.leader(f) for f in files] == [deals[0].leader(f) for f in files]
        assert {dealt.leader(f) for f in files} <= set(dealt.pullers or [])
    assert "3 of 8 nodes" in str(deals[0])


def test_the_deal_shares_a_cap_above_the_nodes_out_and_none_means_no_cap() -> None:
    key = model_key("https://origin.test/m.safetensors")
    nodes = [f"{i:02x}" * 16 for i in range(4)]
    dealt = deal(key, nodes[0], _answers(key, nodes[1:], {}), set(), 64)
    assert dealt.pullers == dealt.cohort and dealt.share == 16
    dealt = deal(key, nodes[0], _answers(key, nodes[1:], {nodes[2]: 10}), set(), None)
    assert dealt.share == 2, "a peer's cap holds where this node has none"
    free = deal(key, nodes[0], _answers(key, nodes[1:], {}), set(), None)
    assert free.pullers is None and free.share is None
    options = leading(LoadOptions.build(), 2)
    assert options.limits is not None and options.limits.concurrency == 2
    assert options.limits.chunk_size <= LEAD_CHUNK
    wide = leading(LoadOptions.build(limits=Limits(concurrency=4)), 16)
    assert wide.limits is not None and wide.limits.concurrency == 4, "a share never raises it"


# -- what a peer says of them, checked ----------------------------------------------------


def _doc(**extra: object) -> dict[str, object]:
    key = "ab" * 32
    return {
        "key": key,
        "url": "https://origin.test/m",
        "node": "cd" * 16,
        "swarm": "10.0.0.1:6881",
        "state": "fetching",
        "files": [],
        **extra,
    }


def test_a_manifests_cap_and_throttles_round_trip() -> None:
    throttled = (Throttled("https://origin.test", 2, 1.5),)
    manifest = Manifest("ab" * 32, "https://origin.test/m", "cd" * 16, "10.0.0.1:6881",
                        "fetching", origin_requests=12)  # fmt: skip
    doc = json.loads(json.dumps(manifest.as_dict(None, throttled)))
    got = parse(doc, "peer", "ab" * 32)
    assert got.origin_requests == 12 and got.throttled == throttled
    assert got == manifest, "throttles are not progress: they do not make a manifest differ"
    bare = parse(_doc(), "peer", "ab" * 32)
    assert bare.origin_requests is None and bare.throttled == ()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"origin_requests": 0}, "origin_requests is 0"),
        ({"origin_requests": -1}, "origin_requests"),
        ({"origin_requests": 1 << 40}, "origin_requests"),
        ({"origin_requests": True}, "origin_requests"),
        ({"origin_requests": "8"}, "origin_requests"),
        ({"throttled": {}}, "throttled is not a list"),
        ({"throttled": [[]]}, r"throttled\[0\] is not an object"),
        ({"throttled": [{"origin": "o", "count": 1, "resume_in": 1}] * 17}, "at most 16"),
        ({"throttled": [{"origin": "o", "count": -1, "resume_in": 1}]}, "count"),
        ({"throttled": [{"origin": "o", "count": 1.5, "resume_in": 1}]}, "count"),
        ({"throttled": [{"origin": "o", "count": 1, "resume_in": -1}]}, "resume_in"),
        ({"throttled": [{"origin": "o", "count": 1, "resume_in": 1e9}]}, "resume_in"),
        ({"throttled": [{"origin": "o", "count": 1, "resume_in": "1"}]}, "resume_in"),
        ({"throttled": [{"origin": "o", "count": 1, "resume_in": True}]}, "resume_in"),
        ({"throttled": [{"origin": "o", "count": 1}]}, "resume_in"),
        ({"throttled": [{"origin": "x" * 300, "count": 1, "resume_in": 1}]}, "origin"),
        ({"throttled": [{"origin": 5, "count": 1, "resume_in": 1}]}, "origin"),
        ({"throttled": [{"origin": "o", "count": 1, "resume_in": 1}] * 2}, "origin twice"),
    ],
)
def test_a_peer_that_lies_about_caps_and_throttles_is_refused(
    extra: dict[str, object], says: str
) -> None:
    with pytest.raises(ManifestError, match=says) as refused:
        parse(_doc(**extra), "peer 10.0.0.9:8790", "ab" * 32)
    assert "peer 10.0.0.9:8790" in str(refused.value)


def test_nan_in_a_throttle_is_refused() -> None:
    raw = json.dumps(_doc(throttled=[{"origin": "o", "count": 1, "resume_in": math.nan}]))
    with pytest.raises(ManifestError, match="resume_in"):
        parse(json.loads(raw), "peer", "ab" * 32)


# -- the setting --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "4097", "1.5", "many", "1e3"])
def test_the_origin_requests_setting_refuses_what_it_cannot_use(value: str) -> None:
    import argparse

    from aioloader.daemon.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {"AIOLOADER_SWARM_ORIGIN_REQUESTS": value, "AIOLOADER_TOKEN": "t" * 32}
    with pytest.raises(ConfigError, match="AIOLOADER_SWARM_ORIGIN_REQUESTS"):
        config_from_args(parser.parse_args([]), env)
    with pytest.raises((ConfigError, SystemExit)):
        config_from_args(parser.parse_args(["--swarm-origin-requests", value]), {})


def test_the_origin_requests_setting_defaults_to_64_and_0_is_no_cap() -> None:
    from aioloader.daemon.config import DaemonConfig

    assert DaemonConfig().swarm_origin_requests == 64
    assert DaemonConfig(swarm_origin_requests=0).swarm_origin_requests == 0


async def test_a_limiter_with_no_origin_is_as_before() -> None:
    limiter = AdaptiveLimiter(4)
    ticket = await limiter.acquire()
    limiter.on_throttle(0.0, ticket)
    limiter.release()
    assert limiter.statistics().limit == 2
    await asyncio.wait_for(limiter.acquire(), 1)
