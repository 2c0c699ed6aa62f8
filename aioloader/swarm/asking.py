"""Asking a peer daemon about a model (``Asker``): the request signed, the answer's
proof checked before its body is read (proof.py), and an unchanged manifest answered
with 304 instead of sent again.

A peer is asked about a model again and again while this node follows it; the node
remembers each peer's last manifest with its ETag and sends ``If-None-Match``, so a
manifest that did not change costs a few hundred bytes, not its torrents again; and
with ``Prefer: wait=N`` the peer holds the ask until the manifest changes, or ``N``
seconds (changes.py): an unchanged peer costs one ask per ``N`` seconds.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..redact import redacting_logger
from ..runtime.threads import run_blocking
from .manifest import (
    MAX_TORRENT,
    FileOffer,
    Manifest,
    ManifestError,
    check_torrent,
    parse,
    swarm_address,
)
from .proof import ANSWER_HEADER, REQUEST_HEADER, PeerProof, ProofError
from .torrents import describe, info_hash

if TYPE_CHECKING:
    import aiohttp

__all__ = ["INLINE_ANSWER", "MAX_ANSWER", "MAX_HOLDING", "MAX_VIEW", "Answer", "Asker", "NoAnswer"]

logger = redacting_logger(__name__)

MAX_ANSWER = 64 << 20  # bytes of a peer's answer read at most
MAX_VIEW = 8 << 20  # bytes of a peer's view of itself read at most
TORRENT_WAIT = 10.0  # seconds a torrent's answer may take at the least
INLINE_ANSWER = 16 << 10  # bytes of an answer decoded on the loop at most (``_read``)
MAX_HOLDING = 64  # asks sent with a hold at once (each takes a connection while held)
_REMEMBERED = 1024  # (peer, model) answers kept for If-None-Match
_TORRENTS_KEPT = 256 << 20  # bytes of fetched torrents kept (by info hash: they never change)


class NoAnswer(ConnectionError):
    """A peer gave no usable answer; the message says why. ``quiet``: it was down or
    slow (logged at debug), not wrong."""

    def __init__(self, reason: str, *, quiet: bool = False) -> None:
        super().__init__(reason)
        self.quiet = quiet


@dataclass
class Answer:
    """A peer that answered: its API address, node id and manifest of the model (if any)."""

    api: str
    node: str
    manifest: Manifest | None
    swarm: str | None = None  # its swarm address: every node trades pieces


class Asker:
    """Asks peers about models, as node ``node`` whose swarm listens at ``swarm``.

    Args:
        client: the aiohttp session (it sends no token: the proof stands for it).
        proof: signs the requests and checks the answers.
        node, swarm: this node's id and swarm address, signed into every request.
        wait: seconds an answer may take.
        lane: where large answers are parsed and torrents checked (CPU work).
    """

    def __init__(
        self,
        client: aiohttp.ClientSession,
        proof: PeerProof,
        node: str,
        swarm: str,
        wait: float,
        lane: Executor,
    ) -> None:
        self.client, self.proof = client, proof
        self.node, self.swarm, self.wait, self.lane = node, swarm, wait, lane
        self._known: OrderedDict[tuple[str, str], tuple[str, Answer]] = OrderedDict()
        self._torrents: OrderedDict[str, bytes] = OrderedDict()
        self._torrent_bytes = 0  # held in ``_torrents``
        self.unchanged = 0  # answers that were a 304 (statistics, tests)
        self.holding = 0  # asks sent with a hold, not answered yet
        # A torrent is asked of its seeder as it publishes it, its uplink full of that
        # range's pieces: on 2 MB/s links, 876 torrent asks of one 32-node cold start
        # took longer than 2 s, and each was given up with its connection, to be asked
        # again on a new one. A connection kept lets TCP recover what the link dropped.
        self.torrent_wait = max(wait, TORRENT_WAIT)
        # The peers whose last request timed out: they took the connection and did not
        # answer in time (busy), where a dead daemon's port refuses (followed.py).
        self.late: set[str] = set()
        self.failed: dict[str, str] = {}  # API address -> why its last ask got no answer

    def __repr__(self) -> str:
        return f"<Asker node={self.node[:8]} {self.proof!r}>"

    async def _get(
        self,
        api: str,
        target: str,
        limit: int,
        headers: dict[str, str] | None = None,
        wait: float | None = None,
    ) -> tuple[int, str, bytes] | None:
        """(status, ETag, body) of a signed GET whose answer proved itself; None: no
        answer, too large, or no proof (logged)."""
        try:
            return await self._answer(api, target, limit, headers, wait)
        except NoAnswer as exc:
            if exc.quiet:
                logger.debug("peer %s: %s", api, exc)
            else:
                logger.warning("peer %s: %s; ignored", api, exc)
            return None

    async def _answer(
        self,
        api: str,
        target: str,
        limit: int,
        headers: dict[str, str] | None = None,
        wait: float | None = None,
    ) -> tuple[int, str, bytes]:
        """(status, ETag, body) of a signed GET whose answer proved itself, within
        ``wait`` seconds (default: the asker's).

        Raises:
            NoAnswer: none, too large, or no proof; saying which (kept in ``failed``).
        """
        try:
            got = await self._asked(api, target, limit, headers, wait)
        except NoAnswer as exc:
            self.failed[api] = str(exc)
            raise
        self.failed.pop(api, None)
        return got

    async def _asked(
        self,
        api: str,
        target: str,
        limit: int,
        headers: dict[str, str] | None,
        wait: float | None,
    ) -> tuple[int, str, bytes]:
        import aiohttp

        wait = self.wait if wait is None else wait
        try:
            async with asyncio.timeout(wait):
                for _ in range(2):
                    header, nonce = self.proof.sign_request("GET", target, self.node, self.swarm)
                    sent = {REQUEST_HEADER: header, **(headers or {})}
                    async with self.client.get(f"http://{api}{target}", headers=sent) as response:
                        status = response.status
                        etag = response.headers.get("ETag", "")
                        proof = response.headers.get(ANSWER_HEADER)
                        raw = await _body(response, limit)
                    if not _replayed(status, proof, raw):
                        break
                    # aiohttp sends a GET again, as it was, when a kept-alive connection
                    # drops before the answer (a held ask's, say): the peer had read it,
                    # and refuses its nonce the second time. Signed anew, once.
        except TimeoutError:
            self.late.add(api)
            raise NoAnswer(f"no answer within {wait:g} s", quiet=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            # Refused or unreachable: gone, maybe. A connection taken and dropped (reset,
            # closed before the answer) is a busy daemon's, late like one that times out.
            if isinstance(exc, aiohttp.ClientConnectorError) or not isinstance(
                exc, aiohttp.ClientError
            ):
                self.late.discard(api)
            else:
                self.late.add(api)
            raise NoAnswer(f"no answer ({str(exc) or type(exc).__name__})", quiet=True) from None
        except ValueError as exc:
            self.late.discard(api)
            raise NoAnswer(str(exc)) from None
        self.late.discard(api)
        try:
            self.proof.check_answer(proof, nonce, status, etag, raw)
        except ProofError as exc:
            raise NoAnswer(f"{exc} (HTTP {status}): is another host at that address now?") from None
        return status, etag, raw

    async def view(self, api: str, wait: float) -> bytes:
        """The peer at ``api``'s view of itself (``GET /v1/swarm/view``), its body as
        sent, within ``wait`` seconds; for looking.py to decode and check.

        Raises:
            NoAnswer: none, not a 200, too large, or no proof; saying which.
        """
        status, _, raw = await self._answer(api, "/v1/swarm/view", MAX_VIEW, wait=wait)
        if status != 200:
            raise NoAnswer(f"HTTP {status} for its view: {raw[:200]!r}")
        return raw

    async def torrent(self, api: str, offer: FileOffer) -> bytes | None:
        """The torrent of ``offer``'s file from the peer at ``api``, by its info hash,
        checked (``check_torrent``); None: no usable answer (logged)."""
        if offer.info_hash is None:
            return None
        return await self._kept(
            api, offer.info_hash, lambda raw: check_torrent(raw, offer, describe, info_hash)
        )

    async def range_torrent(
        self, api: str, digest: str, check: Callable[[bytes], bytes]
    ) -> bytes | None:
        """The range torrent of info hash ``digest`` from the peer at ``api``, passed
        through ``check`` (blocking: it parses; a ``ManifestError`` refuses it); None: no
        usable answer (logged)."""
        return await self._kept(api, digest, check)

    async def _kept(self, api: str, digest: str, check: Callable[[bytes], bytes]) -> bytes | None:
        kept = self._torrents.get(digest)
        if kept is None:
            try:
                status, _, kept = await self._answer(
                    api, f"/v1/swarm/torrents/{digest}", MAX_TORRENT, wait=self.torrent_wait
                )
            except NoAnswer as exc:  # why, said: a timeout, a dropped connection, a refusal
                logger.warning("peer %s: no torrent %s: %s", api, digest[:12], exc)
                return None
            if status != 200:
                logger.warning("peer %s: no torrent %s (HTTP %d)", api, digest[:12], status)
                return None
        try:
            raw = await run_blocking(self.lane, lambda: check(kept))
        except ManifestError as exc:
            logger.warning("peer %s: %s; ignored", api, exc)
            return None
        if digest not in self._torrents:
            self._torrents[digest] = raw
            self._torrent_bytes += len(raw)
        self._torrents.move_to_end(digest)
        while self._torrent_bytes > _TORRENTS_KEPT:
            self._torrent_bytes -= len(self._torrents.popitem(last=False)[1])
        return raw

    async def ask(self, api: str, key: str, hold: float = 0.0) -> Answer | None:
        """The peer at ``api``'s answer about the model ``key``; None: no usable answer
        (down, slow, not JSON, a manifest refused, no proof that it holds the token).
        ``hold``: seconds the peer may hold the ask while the manifest this node knows
        stays unchanged (answering.py), ``MAX_HOLDING`` asks at once at most."""
        known = self._known.get((api, key))
        headers = {"If-None-Match": known[0]} if known is not None else {}
        wait = self.wait
        if known is not None and hold >= 1 and self.holding < MAX_HOLDING:
            headers["Prefer"] = f"wait={int(hold)}"
            wait += int(hold)
            self.holding += 1
        try:
            got = await self._get(api, f"/v1/swarm/models/{key}", MAX_ANSWER, headers, wait)
        finally:
            if "Prefer" in headers:
                self.holding -= 1
        if got is None:
            return None
        status, etag, raw = got
        if status == 304 and known is not None and etag == known[0]:
            self._known.move_to_end((api, key))
            self.unchanged += 1
            return known[1]
        answer = await self._read(api, key, status, raw)
        if answer is not None and answer.manifest is not None and etag:
            self._known[api, key] = (etag, answer)
            while len(self._known) > _REMEMBERED:
                self._known.popitem(last=False)
        else:
            self._known.pop((api, key), None)
        return answer

    async def _read(self, api: str, key: str, status: int, raw: bytes) -> Answer | None:
        """The answer in ``raw``: decoded and parsed on the loop when it is small (a
        manifest of 32 ranges: 6 KiB, 0.13 ms), in the lane when it is not (up to
        ``MAX_ANSWER``; a lane call cost the loop more than a small parse: at 32 nodes,
        16 answers a second, it was the loop's costliest line after the reconnects)."""
        if len(raw) > INLINE_ANSWER:
            return await run_blocking(self.lane, lambda: self._decoded(api, key, status, raw))
        return self._decoded(api, key, status, raw)

    def _decoded(self, api: str, key: str, status: int, raw: bytes) -> Answer | None:
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            logger.warning("peer %s: its answer is not JSON (HTTP %d); ignored", api, status)
            return None
        node = doc.get("node") if isinstance(doc, dict) else None
        if not isinstance(node, str) or not 0 < len(node) <= 64 or not node.isalnum():
            logger.warning("peer %s: its answer names no node (HTTP %d); ignored", api, status)
            return None
        if status == 404:
            try:
                swarm = swarm_address(doc.get("swarm"))
            except ManifestError:
                swarm = None  # it cannot trade pieces; it still counts in the ranking
            return Answer(api, node, None, swarm)
        if status != 200:
            logger.warning("peer %s: HTTP %d for a manifest; ignored", api, status)
            return None
        try:
            manifest = parse(doc, api, key)
        except ManifestError as exc:
            logger.warning("%s", exc)
            return None
        if manifest.node != node:
            return None
        return Answer(api, node, manifest, manifest.swarm)


def _replayed(status: int, proof: str | None, raw: bytes) -> bool:
    """Whether an answer is the peer's refusal of a nonce it saw already (answering.py)."""
    return status == 401 and proof is None and b"replays a request" in raw[:2048]


async def _body(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, as many chunks as it comes in; ValueError past ``limit`` bytes
    (``content.read(n)`` returns what has arrived, a manifest's first chunk only)."""
    chunks, total = [], 0
    async for chunk in response.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise ValueError(f"an answer over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
