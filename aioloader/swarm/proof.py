"""How two daemons prove to each other that they share the cluster's secret, without
ever sending it (pure; no I/O).

The token every daemon of a cluster is given (``AIOLOADER_TOKEN``) is also each
daemon's admin token, so it never leaves the node: an address on ``--peers`` may
belong to a stranger by now (a pod IP recycled, a DNS name pointing elsewhere). What
peers exchange instead is an HMAC-SHA256 under a key derived from the token
(``PeerProof.key``), in both directions of every swarm request:

- the asking node signs its request (method, path and query, its node id and swarm
  address, a time and a random nonce) in ``X-Aioloader-Peer``; the answering node
  checks it, refuses a time more than ``SKEW`` seconds away and a nonce it has seen
  within that window (a replay), and only then answers;
- the answer is signed in ``X-Aioloader-Proof`` over that nonce, the status, the
  ETag and the SHA-256 of the body; the asking node checks it before it reads a
  word of the body. A stranger learns a signature over a nonce it did not choose,
  and cannot make one: whatever it sends is ignored, and named in the log.

A daemon without a token (``--no-auth``) signs nothing and checks nothing: its peers
are whoever answers at their addresses (docs/swarm.md says when that is acceptable).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = [
    "ANSWER_HEADER",
    "REQUEST_HEADER",
    "SKEW",
    "PeerProof",
    "ProofError",
    "ReplayedRequest",
    "SignedRequest",
]

REQUEST_HEADER = "X-Aioloader-Peer"
ANSWER_HEADER = "X-Aioloader-Proof"
SKEW = 300.0
"""Seconds a request's time may differ from the answering node's clock."""

_NONCES = 65_536  # nonces remembered at most (a replay window's worth on a busy node)
_VERSION = "v1"
_FIELD = re.compile(r"^[0-9A-Za-z.:\[\]_-]{1,80}$")


class ProofError(ValueError):
    """A request or answer that does not prove its sender holds the secret."""


class ReplayedRequest(ProofError):
    """A request proven, but whose nonce was answered already: aiohttp sends a GET again,
    as it was, when a kept-alive connection drops before its answer (the asker signs it
    anew: asking.py); or somebody replays one seen on the wire."""


@dataclass(frozen=True)
class SignedRequest:
    """A request's proven fields: the asking node and where its swarm listens."""

    node: str
    swarm: str
    nonce: str


def _fields(text: str) -> dict[str, str]:
    if len(text) > 1024:
        raise ProofError("its proof header is too long")
    version, _, rest = text.partition(";")
    if version.strip() != _VERSION:
        raise ProofError(f"its proof is not {_VERSION}")
    found: dict[str, str] = {}
    for part in rest.split(";"):
        name, sep, value = part.strip().partition("=")
        if not sep or not _FIELD.match(value) or name in found:
            raise ProofError("its proof header is malformed")
        found[name] = value
    return found


class PeerProof:
    """Signs and checks swarm requests and answers with the key derived from ``token``.

    ``token`` None: nothing is signed or checked (``enabled`` is False).
    """

    def __init__(self, token: str | None, clock: float | None = None) -> None:
        self.enabled = bool(token)
        self.key = (
            hmac.new(token.encode(), b"aioloader swarm peer key v1", hashlib.sha256).digest()
            if token
            else b""
        )
        self._clock = clock  # tests: a fixed time
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __repr__(self) -> str:
        return f"<PeerProof {'on' if self.enabled else 'off'}>"

    def _now(self) -> float:
        return time.time() if self._clock is None else self._clock

    def _mac(self, *parts: str) -> str:
        return hmac.new(self.key, "\n".join(parts).encode(), hashlib.sha256).hexdigest()

    # -- the asking side --------------------------------------------------------------

    def sign_request(self, method: str, target: str, node: str, swarm: str) -> tuple[str, str]:
        """(header value, nonce) for a request of ``target`` (path and query)."""
        ts, nonce = str(int(self._now())), os.urandom(16).hex()
        sig = self._mac("request", method.upper(), target, node, swarm, ts, nonce)
        return f"{_VERSION}; node={node}; swarm={swarm}; ts={ts}; nonce={nonce}; sig={sig}", nonce

    def check_answer(
        self, header: str | None, nonce: str, status: int, etag: str, body: bytes
    ) -> None:
        """Raises ProofError unless ``header`` signs this very answer to ``nonce``."""
        if not self.enabled:
            return
        if not header:
            raise ProofError("it sent no proof that it holds the cluster's token")
        sig = _fields(header).get("sig", "")
        want = self._mac("answer", nonce, str(status), etag, hashlib.sha256(body).hexdigest())
        if not hmac.compare_digest(sig, want):
            raise ProofError("its proof does not hold: it does not have the cluster's token")

    # -- the answering side -----------------------------------------------------------

    def check_request(self, header: str | None, method: str, target: str) -> SignedRequest:
        """The proven request, or ProofError: no header, a bad signature, a time off by
        more than ``SKEW`` seconds, a nonce seen before."""
        if not header:
            raise ProofError(f"no {REQUEST_HEADER} header")
        fields = _fields(header)
        try:
            node, swarm, ts, nonce, sig = (
                fields[n] for n in ("node", "swarm", "ts", "nonce", "sig")
            )
        except KeyError as exc:
            raise ProofError(f"its proof has no {exc.args[0]}") from None
        if not self.enabled:
            return SignedRequest(node, swarm, nonce)
        want = self._mac("request", method.upper(), target, node, swarm, ts, nonce)
        if not hmac.compare_digest(sig, want):
            raise ProofError("its proof does not hold: it does not have the cluster's token")
        now = self._now()
        if not ts.isdigit() or abs(int(ts) - now) > SKEW:
            raise ProofError(
                f"its clock is more than {SKEW:g} s away from this node's; keep the nodes' "
                "clocks in sync (NTP)"
            )
        self._forget(now)
        if nonce in self._seen:
            raise ReplayedRequest("it replays a request already answered")
        self._seen[nonce] = now
        return SignedRequest(node, swarm, nonce)

    def _forget(self, now: float) -> None:
        while self._seen:
            nonce, when = next(iter(self._seen.items()))
            if now - when <= 2 * SKEW and len(self._seen) < _NONCES:
                break
            del self._seen[nonce]

    def sign_answer(self, nonce: str, status: int, etag: str, body: bytes) -> str:
        """The ``X-Aioloader-Proof`` value of an answer to the request with ``nonce``."""
        sig = self._mac("answer", nonce, str(status), etag, hashlib.sha256(body).hexdigest())
        return f"{_VERSION}; sig={sig}"
