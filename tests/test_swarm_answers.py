"""A peer's manifest arrives in as many chunks as the network makes of it; the node that
asks reads the whole answer (up to its bound) before parsing it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

pytest.importorskip("libtorrent")

from aioloader.swarm.coordinator import Coordinator
from aioloader.swarm.followed import Answer
from aioloader.swarm.manifest import FileOffer, Manifest, model_key
from aioloader.swarm.torrents import info_hash, make_torrent

URL = "http://origin.test/m/model.safetensors.index.json"
NODE = "cd" * 16


async def _serve(body: bytes, pieces: int) -> tuple[web.AppRunner, str]:
    async def manifest(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        step = -(-len(body) // pieces)
        for at in range(0, len(body), step):
            await response.write(body[at : at + step])
            await asyncio.sleep(0.05)  # each piece its own read on the other side
        await response.write_eof()
        return response

    return await _peer(manifest)


async def _peer(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    route: str = "/v1/swarm/models/{key}",
) -> tuple[web.AppRunner, str]:
    """A peer's ``route`` (its manifest's by default) answered by ``handler``, on 127.0.0.1."""
    app = web.Application()
    app.router.add_get(route, handler)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


async def _ask(api: str, runner: web.AppRunner, scratch: Path) -> Answer | None:
    """What a coordinator makes of the peer at ``api``'s answer about URL's model."""
    try:
        async with Coordinator(
            None,  # type: ignore[arg-type]  # asking peers needs no session
            [],
            "ef" * 16,
            None,
            5.0,
            scratch,
            "127.0.0.1:1",
        ) as coordinator:
            return await coordinator.ask(api, model_key(URL))
    finally:
        await runner.cleanup()


def _manifest(tmp_path: Path, files: int) -> dict[str, object]:
    manifest = Manifest(model_key(URL), URL, NODE, "127.0.0.9:6881", state="complete")
    for i in range(files):
        data = tmp_path / f"shard-{i}"
        data.write_bytes(os.urandom(4096 + i))
        name = f"model-{i:05d}.safetensors"
        torrent = make_torrent(data, name)
        url = f"http://origin.test/m/{name}"
        offer = FileOffer(name, url, 4096 + i, torrent=torrent, info_hash=info_hash(torrent))
        manifest = manifest.with_file(offer)
    return manifest.as_dict()


@pytest.mark.parametrize("pieces", [1, 7])
async def test_a_manifest_in_many_chunks_is_read_whole(tmp_path: Path, pieces: int) -> None:
    doc = _manifest(tmp_path, 40)
    body = json.dumps(doc).encode()
    runner, api = await _serve(body, pieces)
    answer = await _ask(api, runner, tmp_path / "scratch")
    assert answer is not None and answer.manifest is not None
    assert answer.node == NODE
    assert len(answer.manifest.files) == 40
    assert answer.manifest.state == "complete"


async def test_a_node_without_the_model_still_gives_its_swarm_address(tmp_path: Path) -> None:
    """Followers trade pieces with every node that answered, not only the one they follow:
    a 'not held' answer names the node's swarm address too."""
    body = json.dumps({"error": "not_held", "node": NODE, "swarm": "127.0.0.9:6881"}).encode()

    async def not_held(request: web.Request) -> web.Response:
        return web.Response(body=body, status=404, content_type="application/json")

    runner, api = await _peer(not_held)
    answer = await _ask(api, runner, tmp_path / "scratch")
    assert answer is not None and answer.manifest is None
    assert answer.node == NODE and answer.swarm == "127.0.0.9:6881"


async def test_a_torrent_answered_slowly_is_waited_for_on_its_connection(tmp_path: Path) -> None:
    """A seeder asked for a range torrent as it publishes it has its uplink full of that
    range's pieces: its answer may take seconds. Given up at the ask's wait (2 s), 876
    torrent asks of one 32-node cold start were each asked again on a new connection;
    a torrent is now waited for TORRENT_WAIT seconds, whatever the asks' wait."""
    from aioloader.swarm.asking import TORRENT_WAIT
    from aioloader.swarm.proof import ANSWER_HEADER, REQUEST_HEADER, PeerProof
    from aioloader.swarm.session import Swarm

    token = "5e0c2b9d71a4f8e36b1d0c9a7e52f4b8"
    torrent = b"d4:infod6:lengthi1e4:name1:aee"  # what the check lets through here
    digest = "ab" * 32
    asked: list[float] = []

    async def slow(request: web.Request) -> web.Response:
        asked.append(time.monotonic())
        signed = PeerProof(token).check_request(
            request.headers.get(REQUEST_HEADER), "GET", request.path_qs
        )
        await asyncio.sleep(2.5)  # over the asker's wait of 1 s
        proof = PeerProof(token).sign_answer(signed.nonce, 200, "", torrent)
        return web.Response(body=torrent, headers={ANSWER_HEADER: proof})

    runner, api = await _peer(slow, "/v1/swarm/torrents/{hash}")
    swarm = Swarm("127.0.0.1", 0)  # never started
    try:
        async with Coordinator(
            swarm, [], "ef" * 16, token, 1.0, tmp_path / "scratch", "127.0.0.77:6881"
        ) as node:
            assert node._asker is not None and node._asker.torrent_wait == TORRENT_WAIT
            got = await node._asker.range_torrent(api, digest, lambda raw: raw)
    finally:
        await runner.cleanup()
        await swarm.aclose()
    assert got == torrent
    assert len(asked) == 1  # asked once, answered on that connection
