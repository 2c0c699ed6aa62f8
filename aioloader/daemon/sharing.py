"""Starting and stopping the daemon's swarm (with ``--peers``; see docs/swarm.md).

Without peers nothing happens here and libtorrent is never imported. With peers,
libtorrent must be installed (``aioloader[swarm]``) or the daemon does not start;
the session listens on ``--swarm-host`` (default ``--host``) at ``--swarm-port``,
and every download asks the peers first (swarm/coordinator.py). Swarm downloads
land in this daemon's own scratch folder in the cache (swarm/scratch.py): another
daemon on the same cache folder keeps its own, and what a crashed run left there
is removed at start.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigError, StartupError
from .config import DaemonConfig

__all__ = ["sharing"]


@contextlib.asynccontextmanager
async def sharing(
    config: DaemonConfig, cache_root: Any, *, always: bool = False
) -> AsyncIterator[Any]:
    """The started Coordinator (None without peers, unless ``always``: the peers are
    given later, ``Coordinator.set_peers``); stops the swarm on the way out."""
    if not config.peers and not always:
        yield None
        return
    from ..swarm.torrents import libtorrent

    try:
        libtorrent()
    except ConfigError as exc:
        raise StartupError(str(exc)) from None
    from ..runtime.threads import Lane, run_blocking
    from ..swarm.scratch import Scratch

    host = config.swarm_host or config.host
    node = secrets.token_hex(16)
    scratch = Scratch(cache_root / ".swarm" / "incoming", node)
    with Lane("scratch", 1) as lane:
        folder = await run_blocking(lane, scratch.open)
        try:
            async with _swarm(config, host, node, folder) as coordinator:
                yield coordinator
        finally:
            await run_blocking(lane, scratch.close)


@contextlib.asynccontextmanager
async def _swarm(config: DaemonConfig, host: str, node: str, folder: Any) -> AsyncIterator[Any]:
    from ..swarm.coordinator import Coordinator
    from ..swarm.peers import parse_peers
    from ..swarm.session import Swarm

    async with Swarm(
        host, config.swarm_port, stall=config.swarm_stall, rate=config.swarm_rate
    ) as swarm:
        shown = f"[{host}]:{swarm.port}" if ":" in host else f"{host}:{swarm.port}"
        async with Coordinator(
            swarm,
            parse_peers(config.peers),
            node,
            config.token,
            config.swarm_wait,
            folder,
            shown,
            config.swarm_origin_requests or None,
        ) as coordinator:
            yield coordinator
