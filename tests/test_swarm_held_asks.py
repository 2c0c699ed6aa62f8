"""A follower's ask about an unchanged manifest is held until the manifest changes
(``Prefer: wait=N``, answering.py and changes.py): one ask per N seconds for a node that
does not move, an answer the moment it does. Before, three asks in four were answered
"unchanged" at once, about 15 a second per node at 32 nodes, and the fleet's CPU went
to asking.

Real parts: the daemon's own swarm routes in an aiohttp server on 127.0.0.1, a real
Coordinator asking them with the cluster's proof, a libtorrent session that is never
started (nothing here trades pieces)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

pytest.importorskip("libtorrent")

from aioloader.swarm import answering
from aioloader.swarm.answering import _hold, add_swarm_routes
from aioloader.swarm.changes import MAX_HOLD, Manifests
from aioloader.swarm.coordinator import Coordinator
from aioloader.swarm.followed import Followed
from aioloader.swarm.manifest import FileOffer, Manifest, model_key
from aioloader.swarm.proof import ANSWER_HEADER, REQUEST_HEADER, PeerProof
from aioloader.swarm.session import Swarm

from .counted_lane import CountedLane
from .fleet import TOKEN

URL = "http://origin.test/m/model.safetensors"
KEY = model_key(URL)
HOLDER, ASKER = "cd" * 16, "ef" * 16


class Holder:
    """A node's swarm routes on 127.0.0.1, over a real Coordinator that holds a manifest."""

    def __init__(self, coordinator: Coordinator, api: str, runner: web.AppRunner) -> None:
        self.coordinator, self.api, self.runner = coordinator, api, runner
        self.path = f"/v1/swarm/models/{KEY}"

    def move(self, done: int) -> None:
        """The manifest changes: ``done`` bytes of its one file read."""
        manifest = self.coordinator.manifests[KEY]
        offer = FileOffer("m/model.safetensors", URL, 1 << 20, done=done)
        self.coordinator.manifests[KEY] = replace(manifest.with_file(offer))

    async def get(
        self, session: aiohttp.ClientSession, **headers: str
    ) -> tuple[int, str, bytes, float]:
        """(status, ETag, body, seconds) of a signed GET of the manifest, proof checked."""
        proof = PeerProof(TOKEN)
        header, nonce = proof.sign_request("GET", self.path, ASKER, "127.0.0.77:6881")
        started = time.monotonic()
        async with session.get(
            f"http://{self.api}{self.path}", headers={REQUEST_HEADER: header, **headers}
        ) as response:
            body = await response.read()
            etag = response.headers.get("ETag", "")
            proof.check_answer(
                response.headers.get(ANSWER_HEADER), nonce, response.status, etag, body
            )
            return response.status, etag, body, time.monotonic() - started


@pytest.fixture
async def holder(tmp_path: Path) -> AsyncIterator[Holder]:
    swarm = Swarm("127.0.0.1", 0)  # never started
    try:
        async with Coordinator(swarm, [], HOLDER, TOKEN, 1.0, tmp_path, "127.0.0.9:6881") as node:
            node.manifests[KEY] = Manifest(KEY, URL, HOLDER, "127.0.0.9:6881", state="fetching")
            app = web.Application()
            add_swarm_routes(app, lambda: node, lambda: TOKEN)
            runner = web.AppRunner(app, shutdown_timeout=0.5)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            try:
                yield Holder(node, f"127.0.0.1:{port}", runner)
            finally:
                await runner.cleanup()
    finally:
        await swarm.aclose()


@pytest.fixture
async def asker(tmp_path: Path) -> AsyncIterator[Coordinator]:
    swarm = Swarm("127.0.0.1", 0)
    try:
        async with Coordinator(
            swarm, [], ASKER, TOKEN, 1.0, tmp_path / "asker", "127.0.0.77:6881"
        ) as node:
            yield node
    finally:
        await swarm.aclose()


async def test_an_unchanged_manifest_is_held_until_it_changes(holder: Holder) -> None:
    async with aiohttp.ClientSession() as session:
        status, etag, _, _ = await holder.get(session)
        assert status == 200 and etag
        asked = asyncio.ensure_future(
            holder.get(session, **{"If-None-Match": etag, "Prefer": "wait=10"})
        )
        await asyncio.sleep(0.5)
        assert not asked.done(), "an unchanged manifest was answered at once, not held"
        assert holder.coordinator.holding == 1
        holder.move(4096)
        status, changed, body, took = await asyncio.wait_for(asked, 3)
        assert status == 200 and changed != etag and b'"done":4096' in body
        assert 0.5 <= took < 2.0, took
        assert holder.coordinator.holding == 0
        # Unchanged for the whole wait: the 304, after it.
        status, same, body, took = await holder.get(
            session, **{"If-None-Match": changed, "Prefer": "wait=1"}
        )
        assert (status, same, body) == (304, changed, b"") and 0.9 <= took < 3.0, took


@pytest.mark.parametrize(
    "prefer",
    ["", "wait=abc", "wait=-1", "wait=1.5", "wait=", "wait=²", "respond-async", "x" * 8000],
)
async def test_a_preference_not_understood_is_answered_at_once(holder: Holder, prefer: str) -> None:
    async with aiohttp.ClientSession() as session:
        _, etag, _, _ = await holder.get(session)
        status, _, _, took = await holder.get(session, **{"If-None-Match": etag, "Prefer": prefer})
        assert status == 304 and took < 0.5, (prefer[:20], took)


def test_the_wait_preference_is_read_as_rfc_7240_has_it() -> None:
    assert _hold("wait=5") == 5.0
    assert _hold("respond-async, wait=7") == 7.0
    assert _hold('WAIT="3"; x=1') == 3.0
    assert _hold("wait=" + "9" * 5000) == MAX_HOLD  # huge: the most a node holds
    assert _hold("wait=99999999") == MAX_HOLD
    for wrong in ("", "wait", "wait=-1", "wait=1.5", "wait=1e3", "wait=²", "waiting=3", ",,,"):
        assert _hold(wrong) == 0.0, wrong


async def test_a_changed_manifest_is_answered_at_once_whatever_the_wait(holder: Holder) -> None:
    async with aiohttp.ClientSession() as session:
        _, etag, _, _ = await holder.get(session)
        holder.move(1)
        status, _, _, took = await holder.get(
            session, **{"If-None-Match": etag, "Prefer": "wait=30"}
        )
        assert status == 200 and took < 0.5
        # A model withdrawn while an ask is held: its "not held" at once.
        _, etag, _, _ = await holder.get(session)
        asked = asyncio.ensure_future(
            holder.get(session, **{"If-None-Match": etag, "Prefer": "wait=30"})
        )
        await asyncio.sleep(0.3)
        holder.coordinator.manifests.pop(KEY)
        status, _, body, took = await asyncio.wait_for(asked, 3)
        assert status == 404 and b"not_held" in body and took < 2.0


async def test_past_max_held_an_unchanged_manifest_is_answered_at_once(
    holder: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answering, "MAX_HELD", 2)
    async with aiohttp.ClientSession() as session:
        _, etag, _, _ = await holder.get(session)
        held = {"If-None-Match": etag, "Prefer": "wait=30"}
        first = [asyncio.ensure_future(holder.get(session, **held)) for _ in range(2)]
        await asyncio.sleep(0.5)
        assert holder.coordinator.holding == 2
        status, _, _, took = await holder.get(session, **held)
        assert status == 304 and took < 0.5
        assert not any(f.done() for f in first)
        holder.coordinator.manifests.release()  # the daemon stopping: all answered now
        answers = await asyncio.wait_for(asyncio.gather(*first), 3)
        assert [a[0] for a in answers] == [304, 304]
        status, _, _, took = await holder.get(session, **held)  # released: none held again
        assert status == 304 and took < 0.5
    assert holder.coordinator.holding == 0


async def test_an_asker_gone_frees_its_held_ask(holder: Holder) -> None:
    async with aiohttp.ClientSession() as session:
        _, etag, _, _ = await holder.get(session)
    for _ in range(3):
        async with aiohttp.ClientSession() as session:
            asked = asyncio.ensure_future(
                holder.get(session, **{"If-None-Match": etag, "Prefer": "wait=30"})
            )
            await asyncio.sleep(0.3)
            asked.cancel()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # each looks at its asker once a second
        if holder.coordinator.holding == 0:
            break
        await asyncio.sleep(0.05)
    assert holder.coordinator.holding == 0, "a held ask outlived its asker"


async def test_a_coordinator_asks_with_a_hold_and_is_not_taken_for_late(
    holder: Holder, asker: Coordinator
) -> None:
    first = await asker.ask(holder.api, KEY)
    assert first is not None and first.manifest is not None
    asked = asyncio.ensure_future(asker.ask(holder.api, KEY, 3.0))
    await asyncio.sleep(1.5)  # longer than the asker's own wait (1 s)
    assert not asked.done()
    holder.move(8192)
    answer = await asyncio.wait_for(asked, 3)
    assert answer is not None and answer.manifest is not None
    assert answer.manifest.files[0].done == 8192
    assert holder.api not in asker._asker.late  # type: ignore[union-attr]
    # Unchanged through the whole hold: the manifest known, from a 304.
    unchanged = asker._asker.unchanged  # type: ignore[union-attr]
    again = await asker.ask(holder.api, KEY, 1.0)
    assert again is not None and again.manifest == answer.manifest
    assert asker._asker.unchanged == unchanged + 1  # type: ignore[union-attr]
    assert asker._asker.holding == 0  # type: ignore[union-attr]


async def test_an_ask_the_client_sends_again_after_a_dropped_connection_is_signed_anew(
    holder: Holder, asker: Coordinator
) -> None:
    """aiohttp sends a GET again, headers and all, when a kept-alive connection drops
    before the answer; the peer had read the first (a held ask) and refused the nonce
    again as a replay: "it sent no proof", 17 times in one cold start of 32 nodes."""
    first = await asker.ask(holder.api, KEY)  # the connection is kept alive after it
    assert first is not None and first.manifest is not None
    asked = asyncio.ensure_future(asker.ask(holder.api, KEY, 2.0))
    await asyncio.sleep(0.5)
    assert holder.coordinator.holding == 1  # held: its nonce seen
    server = holder.runner.server
    assert server is not None
    for transport in list(server._connections.values()):
        transport.close()
    answer = await asyncio.wait_for(asked, 6)
    assert answer is not None and answer.manifest == first.manifest


async def test_a_followed_node_holding_its_ask_is_not_dropped(
    holder: Holder, asker: Coordinator
) -> None:
    """Its answer comes after the hold: the watch waits the hold and the gone time."""
    first = await asker.ask(holder.api, KEY)
    assert first is not None
    followed = Followed(first, KEY, asker.ask, stall=30.0, gone=1.0, hold=3.0)
    watch = asyncio.ensure_future(followed.watch())
    try:
        await asyncio.sleep(5.0)
        assert not watch.done(), watch.exception() if watch.done() else None
        holder.move(1)  # and a change reaches it at once
        deadline = time.monotonic() + 2
        while followed.manifest is not None and not followed.manifest.files:
            assert time.monotonic() < deadline, "the change did not reach the follower"
            await asyncio.sleep(0.05)
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)


async def test_a_node_first_answering_after_the_stall_time_is_not_taken_for_still(
    holder: Holder, asker: Coordinator
) -> None:
    """A fetch asks a followed node for a file after the stall time has passed since the
    node was followed, before any answer of the node has come (a busy node's first answer
    took 2.1 s, the stall time was 2 s): the file is waited for, not given up on at once
    without one look (a cold node then pulled it from the origin a second time)."""
    first = await asker.ask(holder.api, KEY)
    assert first is not None
    followed = Followed(first, KEY, asker.ask, stall=1.0, gone=1.0, hold=10.0)
    await asyncio.sleep(1.5)  # no answer heard meanwhile; the node lists the file since
    holder.move(1)
    offer = await asyncio.wait_for(followed.offer("m/model.safetensors"), 5)
    assert offer.done == 1


async def test_a_node_answering_unchanged_for_the_stall_time_is_still_despite_a_long_hold(
    holder: Holder, asker: Coordinator
) -> None:
    """Its answers show it still for the stall time: SwarmStalled, after about the stall
    time, however long the ask may be held (the hold is the stall time at most)."""
    from aioloader.swarm.download import SwarmStalled

    first = await asker.ask(holder.api, KEY)
    assert first is not None
    followed = Followed(first, KEY, asker.ask, stall=1.0, gone=1.0, hold=10.0)
    started = time.monotonic()
    with pytest.raises(SwarmStalled, match=r"no file m/model\.safetensors for 1 s"):
        await asyncio.wait_for(followed.offer("m/model.safetensors"), 8)
    assert time.monotonic() - started < 4.0


async def test_a_change_on_another_thread_wakes_the_wait() -> None:
    manifests = Manifests()
    manifest = Manifest(KEY, URL, HOLDER, "127.0.0.9:6881")
    waiting = asyncio.ensure_future(manifests.changed(10))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    threading.Thread(target=lambda: manifests.__setitem__(KEY, manifest)).start()
    await asyncio.wait_for(waiting, 2)
    assert time.monotonic() - started < 1.0
    # setdefault of a key there already is no change: the wait runs its time.
    started = time.monotonic()
    manifests.setdefault(KEY, replace(manifest, state="complete"))
    await manifests.changed(0.3)
    assert time.monotonic() - started >= 0.25 and manifests[KEY].state == "following"
    manifests.release()
    started = time.monotonic()
    await manifests.changed(10)
    assert time.monotonic() - started < 0.1


def test_a_daemon_stopping_answers_the_asks_it_holds(tmp_path: Path) -> None:
    """SIGTERM with a peer's ask held: answered at once, and the daemon is gone in well
    under its shutdown's wait for open requests (5 s) instead of after it."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from . import fixtures_fleet
    from .fleet import Fleet, Origin, swarm_missing, write_model

    if swarm_missing() is not None:
        pytest.skip(f"needs the node swarm: {swarm_missing()}")
    (tmp_path / "origin").mkdir()
    with Origin(tmp_path / "origin") as origin:
        model = write_model(origin.root / "llm", 1 << 20, shards=1)
        url = fixtures_fleet.url_of(origin, model)
        path = f"/v1/swarm/models/{model_key(url)}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def get(fleet: Fleet, **headers: str) -> tuple[int, str]:
            proof = PeerProof(TOKEN)
            header, _ = proof.sign_request("GET", path, ASKER, "127.0.0.77:6881")
            request = urllib.request.Request(
                fleet[0].url + path, headers={REQUEST_HEADER: header, **headers}
            )
            try:
                with opener.open(request, timeout=60) as response:
                    return response.status, response.headers.get("ETag", "")
            except urllib.error.HTTPError as exc:
                return exc.code, ""

        with Fleet(1, tmp_path / "fleet", swarm=True) as fleet, ThreadPoolExecutor(1) as pool:
            fleet.start()
            fleet.post(0, url, "llm")
            fleet.wait_ready(0, "llm", seconds=60)
            status, etag = get(fleet)
            assert status == 200 and etag
            held = pool.submit(get, fleet, **{"If-None-Match": etag, "Prefer": "wait=30"})
            time.sleep(1.0)
            assert not held.done(), held.result()
            started = time.monotonic()
            assert fleet.stop(0) == 0
            took = time.monotonic() - started
            assert held.result(timeout=5)[0] == 304
            assert took < 3.0, f"the daemon took {took:.1f} s to stop with an ask held"


# -- what an ask costs the loop: calls into a lane ---------------------------------------


async def test_a_node_holding_nothing_whole_answers_asks_without_a_lane_call(
    holder: Holder,
) -> None:
    """Each answer first looks for seeded files gone from the cache, a call into a lane
    of stat calls; a node that seeds no whole file (all of a cold start) has none to
    look at. At 32 nodes, 16 answers a second each, that call was the loop's second
    costliest line in a profile."""
    node = holder.coordinator
    counted, kept = CountedLane("held", 1), node._looks
    node._looks = counted
    try:
        async with aiohttp.ClientSession() as session:
            for done in range(10):
                holder.move(done)
                status, _, _, _ = await holder.get(session)
                assert status == 200
        assert counted.calls == 0
    finally:
        node._looks = kept
        counted.close()


def _manifest_of(files: int) -> Manifest:
    offers = tuple(
        FileOffer(f"m/shard-{i:05d}.safetensors", f"{URL}.{i}", 1 << 20, done=i)
        for i in range(files)
    )
    return Manifest(KEY, URL, HOLDER, "127.0.0.9:6881", state="fetching", files=offers)


@pytest.mark.parametrize("files", [1, 400])
async def test_an_answer_is_parsed_on_the_loop_when_small_in_the_lane_when_large(
    holder: Holder, asker: Coordinator, files: int
) -> None:
    """A manifest of 32 ranges is 6 KiB and parses in 0.13 ms: its lane call cost the
    loop more than the parse (16 answers a second per node at 32 nodes). One of up to
    64 MiB is still decoded and parsed in the lane, off the loop."""
    holder.coordinator.manifests[KEY] = _manifest_of(files)
    counted, kept = CountedLane("swarm", 1), asker._asker.lane  # type: ignore[union-attr]
    asker._asker.lane = counted  # type: ignore[union-attr]
    try:
        answer = await asker.ask(holder.api, KEY)
        assert answer is not None and answer.manifest == holder.coordinator.manifests[KEY]
        assert len(answer.manifest.files) == files
        large = files > 1
        assert counted.calls == (1 if large else 0)
    finally:
        asker._asker.lane = kept  # type: ignore[union-attr]
        counted.close()


async def test_a_request_sent_again_is_refused_and_said_not_warned_of(
    holder: Holder, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp sends a GET again, as it was, when a kept-alive connection drops before
    its answer, and the asker signs it anew: each cold start of 32 nodes logged 35-70
    warnings of "replays a request already answered", none of them anybody's fault. A
    stranger's proof is still warned of."""
    proof = PeerProof(TOKEN)
    header, _ = proof.sign_request("GET", holder.path, ASKER, "127.0.0.77:6881")
    url = f"http://{holder.api}{holder.path}"
    caplog.set_level(logging.INFO, logger="aioloader.swarm.answering")
    async with aiohttp.ClientSession() as session:
        statuses = []
        for _ in range(2):
            async with session.get(url, headers={REQUEST_HEADER: header}) as response:
                statuses.append(response.status)
        stranger, _ = PeerProof("another cluster's token").sign_request(
            "GET", holder.path, ASKER, "127.0.0.77:6881"
        )
        async with session.get(url, headers={REQUEST_HEADER: stranger}) as response:
            statuses.append(response.status)
    assert statuses == [200, 401, 401]
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert [(r.levelno, "replays" in r.getMessage()) for r in refused] == [
        (logging.INFO, True),
        (logging.WARNING, False),
    ]
