"""Starting and stopping the daemon's swarm (with ``--peers``; see docs/swarm.md).

Without peers nothing happens here and libtorrent is never imported. With peers,
libtorrent must be installed (``aioloader[swarm]``) or the daemon does not start;
the session listens on ``--swarm-host`` (default ``--host``) at ``--swarm-port``,
and every download asks the peers first (swarm/coordinator.py).
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
async def sharing(config: DaemonConfig, cache_root: Any) -> AsyncIterator[Any]:
    """The started Coordinator (None without peers); stops the swarm on the way out."""
    if not config.peers:
        yield None
        return
    from ..swarm.torrents import libtorrent

    try:
        libtorrent()
    except ConfigError as exc:
        raise StartupError(str(exc)) from None
    from ..swarm.coordinator import Coordinator
    from ..swarm.peers import parse_peers
    from ..swarm.session import Swarm

    host = config.swarm_host or config.host
    node = secrets.token_hex(16)
    async with Swarm(host, config.swarm_port, stall=config.swarm_stall) as swarm:
        shown = f"[{host}]:{swarm.port}" if ":" in host else f"{host}:{swarm.port}"
        async with Coordinator(
            swarm,
            parse_peers(config.peers),
            node,
            config.token,
            config.swarm_wait,
            cache_root / ".swarm" / "incoming",
            shown,
        ) as coordinator:
            yield coordinator
