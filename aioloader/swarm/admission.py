"""Which addresses the swarm lets connect (``Admission``): the peers' as ``--peers``
resolves them, and the swarm addresses proven peers gave.

libtorrent's IP filter lets only these addresses connect, either way. The ``--peers``
list names the peers' API, which need not be where their swarm listens
(``--swarm-host`` apart from ``--host``), and a pod back on a new address is not in
anybody's last resolution. So the filter also takes every swarm address a peer gave
in a request or an answer that proved it holds the cluster's token (proof.py): the
swarm address its own manifest or ``not_held`` answer advertises, and the address its
request came from. The list is resolved again every ``REFRESH`` seconds, idle or not,
and at the start of every fetch. Without a token nothing is proven: the filter holds
the resolved peers only.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Iterable

from ..redact import redacting_logger
from ..runtime.threads import Lane
from .peers import MAX_PEERS, PeerAddress, resolve
from .session import Swarm

__all__ = ["REFRESH", "Admission"]

logger = redacting_logger(__name__)

REFRESH = 30.0
"""Seconds between resolutions of ``--peers`` while the daemon is idle."""

_LEARNED_FOR = 24 * 3600.0  # seconds a proven address stays admitted after it was last seen


@functools.lru_cache(maxsize=1024)  # asked per request: a few hundred addresses in all
def _ip(text: str | None) -> str | None:
    """The IP address of ``ip:port``, ``[ip]:port`` or a bare address; None if none (or
    an unspecified address, 0.0.0.0 or ::)."""
    if not text:
        return None
    host = text.rpartition(":")[0] if text.count(":") == 1 or text.startswith("[") else text
    host = host.strip("[]") or text
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if address.is_unspecified else str(address)


class Admission:
    """The swarm's IP filter: resolved peers and proven peers' addresses.

    Args:
        swarm: the session whose filter this keeps.
        peers: the ``--peers`` entries.
        proven: whether peers prove they hold the token (without one nothing is
            learned from them).
    """

    def __init__(self, swarm: Swarm, peers: list[PeerAddress], proven: bool) -> None:
        self.swarm, self.peers, self.proven = swarm, peers, proven
        self._lane = Lane("resolve", 1)
        self._resolved: set[str] = set()
        self._learned: OrderedDict[str, float] = OrderedDict()
        self._applied: frozenset[str] | None = None
        self._resolved_at = float("-inf")

    def __repr__(self) -> str:
        return f"<Admission resolved={len(self._resolved)} learned={len(self._learned)}>"

    def close(self) -> None:
        self._lane.close()

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(self._resolved) | frozenset(self._learned)

    async def resolve(self) -> list[str]:
        """Every peer API address (``host:port``), resolved now; the filter follows."""
        found = await resolve(self.peers, self._lane)
        self._resolved = {ip for ip, _ in found}
        self._resolved_at = time.monotonic()
        await self._apply()
        return [f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}" for ip, p in found]

    async def refresh(self) -> None:
        """Resolve the list again if it was not for ``REFRESH`` seconds (the idle watch)."""
        if time.monotonic() - self._resolved_at >= REFRESH:
            await self.resolve()

    async def learn(self, addresses: Iterable[str | None]) -> None:
        """Admit the addresses a proven peer gave (``ip:port`` or a bare IP)."""
        if not self.proven:
            return
        now = time.monotonic()
        for text in addresses:
            ip = _ip(text)
            if ip is not None:
                self._learned[ip] = now
                self._learned.move_to_end(ip)
        while self._learned:
            oldest, when = next(iter(self._learned.items()))
            if now - when <= _LEARNED_FOR and len(self._learned) <= MAX_PEERS:
                break
            del self._learned[oldest]
        await self._apply()

    async def _apply(self) -> None:
        allowed = self.allowed
        if allowed != self._applied:
            await self.swarm.allow(allowed)
            self._applied = allowed
            logger.debug("swarm filter: %d addresses", len(allowed))
