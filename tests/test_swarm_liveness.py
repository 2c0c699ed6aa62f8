"""When a followed node is taken for dead: a port that refuses (the daemon is gone) after
the short ``gone`` time; a node that takes the connection and answers late (a busy
daemon: 32 of them on two vCPUs) only after the stall time. Real sockets, the real
asker; no answer is faked."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from aioloader.runtime.threads import Lane
from aioloader.swarm.asking import Asker
from aioloader.swarm.download import SwarmError
from aioloader.swarm.followed import Answer, Followed
from aioloader.swarm.proof import PeerProof

KEY = "k" * 64
NODE = "ab" * 16


async def _watch_until_dropped(api: str, gone: float, stall: float) -> tuple[float, str]:
    """Seconds until a Followed watching ``api`` gives it up, and why."""
    with Lane("ask", 1) as lane:
        async with aiohttp.ClientSession() as client:
            asker = Asker(client, PeerProof("t" * 32), "cd" * 16, "127.0.0.1:1", 0.3, lane)
            followed = Followed(
                Answer(api, NODE, None), KEY, asker.ask, stall, gone,
                late=lambda a: a in asker.late,
            )  # fmt: skip
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(SwarmError) as caught:
                await asyncio.wait_for(followed.watch(), stall * 4)
            return loop.time() - start, str(caught.value)


async def test_a_refusing_port_is_dropped_after_the_gone_time() -> None:
    with socket.socket() as probe:  # a port nothing listens on: refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    took, why = await _watch_until_dropped(f"127.0.0.1:{port}", gone=1.0, stall=6.0)
    assert "not answered for 1 s" in why
    assert took < 6.0  # the stall time is for a node that answers late, not this one


async def test_a_node_that_answers_late_is_given_the_stall_time() -> None:
    """Before: dropped after the gone time like a dead one (85 drops in one cold start of
    32 nodes), and every node that followed it dealt its ranges again."""
    hold = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await hold.wait()  # takes the connection, never answers in time
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/v1/swarm/models/{key}", slow)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        took, why = await _watch_until_dropped(f"127.0.0.1:{port}", gone=1.0, stall=3.0)
    finally:
        hold.set()
        await runner.cleanup()
    assert "answered late or not at all for 3 s" in why
    assert took >= 3.0
