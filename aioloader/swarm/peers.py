"""The peer daemons (``--peers``): parsed once, resolved again as the cluster changes.

An entry is ``host:port`` of a peer daemon's API (``[::1]:8790`` for an IPv6 address),
or a DNS name with a port that resolves to every daemon (a headless Service): each
address it resolves to is a peer. A name that does not resolve (yet) is skipped with
a warning: a list may name daemons that have not started.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass

from ..errors import ConfigError
from ..redact import redacting_logger
from ..runtime.threads import run_blocking

__all__ = ["MAX_PEERS", "PeerAddress", "parse_peers", "resolve"]

logger = redacting_logger(__name__)

MAX_PEERS = 4096
"""Entries a list may hold (and addresses a resolution may give)."""

_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*\.?$")
_HINT = "write host:port, [ipv6]:port or dns-name:port, comma-separated"


@dataclass(frozen=True, order=True)
class PeerAddress:
    """One entry: a host (name or address) and the port of its daemon's API."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _entry(text: str, where: str) -> PeerAddress:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{where}: peer {text!r:.80} {why}; {_HINT}")

    if any(c.isspace() or not c.isprintable() for c in text):
        raise bad("holds whitespace or a control character")
    if "/" in text or "@" in text:
        raise bad("is not a host name or address (a URL? give its host:port)")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise bad("has no port after the bracketed address")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad("holds no IPv6 address in its brackets") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise bad("has no port")
        if ":" in host:
            raise bad("is an IPv6 address without brackets")
        if not _NAME.match(host):
            raise bad("is not a host name or address")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise bad("has a port that is not 1-65535")
    return PeerAddress(host.lower(), int(port_text))


def parse_peers(text: str | Iterable[str] | None, where: str = "--peers") -> list[PeerAddress]:
    """The entries of ``text`` (a comma-separated string, or several), each once, in order.

    Raises:
        ConfigError: naming ``where`` and the entry: not host:port, a port out of
            range, an IPv6 address without brackets, more than ``MAX_PEERS`` entries.
    """
    if text is None:
        return []
    if isinstance(text, str):
        text = [text]
    found: dict[PeerAddress, None] = {}
    for part in text:
        if not isinstance(part, str):
            raise ConfigError(f"{where}: a peer is a 'host:port' string, not {part!r:.80}")
        for item in part.split(","):
            if item.strip():
                found[_entry(item.strip(), where)] = None
            if len(found) > MAX_PEERS:
                raise ConfigError(f"{where}: more than {MAX_PEERS} peers; {_HINT}")
    return list(found)


def _lookup(peer: PeerAddress) -> list[tuple[str, int]]:
    try:
        infos = socket.getaddrinfo(peer.host, peer.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        logger.warning("peer %s does not resolve (%s); skipped for now", peer, exc)
        return []
    return [(str(info[4][0]), peer.port) for info in infos]


async def resolve(peers: Iterable[PeerAddress], lane: Executor) -> list[tuple[str, int]]:
    """Every address the peers resolve to, as (ip, API port), each once, in order; a
    name that does not resolve is skipped (a warning). Looked up in ``lane``."""
    found: dict[tuple[str, int], None] = {}
    for peer in peers:
        for address in await run_blocking(lane, lambda p=peer: _lookup(p)):  # type: ignore[misc]
            found[address] = None
            if len(found) >= MAX_PEERS:
                return list(found)
    return list(found)
