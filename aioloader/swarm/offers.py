"""What a daemon offers its peers (``Offers``): per model, its manifest, and the
committed files it seeds from its cache entries.

A file is offered once it is committed (``SwarmSupply.committed``), once a fetch finds it
in the cache at the origin's current version (before this node follows anyone for
anything: a warm fleet restarted at once gets ready), and for every file of a model
whose fetch ended. A file that leaves the cache (evicted, deleted, replaced) leaves
the session and the manifest (``check_held``); a model no longer whole here, and not
being fetched, is no longer offered at all. The coordinator (coordinator.py) adds the
fetching through peers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache.entry import Version
from ..errors import LoaderError
from ..redact import redacting_logger
from ..runtime.threads import Lane, run_blocking
from ..runtime.throttle import origins
from ..sources.base import Current
from .changes import Manifests
from .held import Held, HeldFile
from .manifest import FileOffer, Manifest, Throttled, file_name, torrent_name
from .session import Swarm
from .torrents import info_hash, make_torrent

if TYPE_CHECKING:
    from ..cache.model_cache import ModelCache
    from ..cache.records import CachedModel

__all__ = ["Offers"]

logger = redacting_logger(__name__)


class Offers:
    """The manifests and seeded files of node ``node``, whose swarm is ``swarm``."""

    def __init__(self, swarm: Swarm, node: str, advertised: str) -> None:
        self.swarm = swarm
        self.node = node
        self.advertised = advertised
        self.manifests = Manifests()  # a change wakes the asks held on it (answering.py)
        self.holding = 0  # asks held now (answering.py)
        # answering.py's: manifest, (address, throttled), body, ETag
        self.encoded: dict[str, tuple[Manifest, object, bytes, str]] = {}
        self.held = Held()
        self._fetching: set[str] = set()  # models being fetched: a file may leave alone
        self._lane = Lane("swarm", 1)  # torrents made, manifests parsed
        self._looks = Lane("held", 1)  # stat calls, never behind a torrent being made

    def torrent(self, digest: str) -> bytes | None:
        """The torrent with the info hash ``digest`` among the files offered, or None."""
        for manifest in self.manifests.values():
            for offer in manifest.files:
                if offer.info_hash == digest and offer.torrent is not None:
                    return offer.torrent
                for one in offer.ranges:  # its info dict: the hashes come from the seeder
                    if one.info_hash == digest and one.served is not None:
                        return one.served
        return None

    def throttled(self) -> tuple[Throttled, ...]:
        """The throttling answers this process got, per origin (runtime/throttle.py),
        for its manifests: the nodes that read them slow down too."""
        got = [o for o in origins() if o.throttled and len(o.name) <= 256]
        got.sort(key=lambda o: o.last, reverse=True)  # the latest first, if many
        return tuple(Throttled(o.name, o.throttled, round(o.resume_in(), 1)) for o in got[:16])

    def close(self) -> None:
        self._lane.close()
        self._looks.close()

    async def check_held(self) -> None:
        """Stop offering the files that left the cache (evicted, deleted, replaced): their
        torrents leave the session; a model no longer whole here, and not being fetched,
        leaves the manifests with every torrent of it. Nothing held whole, nothing to
        look at, and no call in the lane: every answered ask checks (at 32 nodes one
        pulling, each node answered 16 asks a second, a lane call each)."""
        if not self.held:
            return
        for gone in await run_blocking(self._looks, self.held.gone):
            await self._unoffer(gone)

    async def _unoffer(self, gone: HeldFile) -> None:
        await self.swarm.remove(gone.info_hash)
        manifest = self.manifests.get(gone.key)
        logger.info("%s left the cache: no longer offered to peers", gone.path)
        if manifest is None:
            return
        await self._unrange(manifest.file(gone.name))
        if gone.key in self._fetching:
            self.manifests[gone.key] = manifest.without(gone.name)
        else:
            await self._withdraw(gone.key)

    async def _withdraw(self, key: str) -> None:
        """Offer nothing of the model ``key`` any more."""
        manifest = self.manifests.pop(key, None)
        for offer in manifest.files if manifest is not None else ():
            await self._unrange(offer)
        for held in self.held.drop(key):
            await self.swarm.remove(held.info_hash)

    async def _unrange(self, offer: FileOffer | None) -> None:
        """The range torrents of ``offer`` leave the session (ranged.py)."""
        for one in offer.ranges if offer is not None else ():
            if one.info_hash is not None and one.torrent is not None:
                await self.swarm.remove(one.info_hash)

    def _note(self, key: str) -> Callable[[FileOffer], None]:
        def noted(offer: FileOffer) -> None:
            manifest = self.manifests.get(key)
            if manifest is None:  # withdrawn meanwhile: the fetch is ending
                return
            known = manifest.file(offer.name)
            if known is None or known.torrent is None:
                self.manifests[key] = manifest.with_file(offer)

        return noted

    async def _held_here(
        self, key: str, cache: ModelCache, url: str, current: Current
    ) -> Path | None:
        """Where ``cache`` holds ``url`` at the origin's ``current`` version, or None; a
        file held is offered to the peers now, before this node follows anyone."""
        files = cache.entry_files(url)
        version = Version(*current)
        if await run_blocking(self._looks, lambda: files.complete_for(version)) is None:
            return None
        manifest = self.manifests.get(key)
        offer = manifest.file(file_name(url)) if manifest is not None else None
        if offer is not None and offer.torrent is not None and offer.size == current.size:
            with contextlib.suppress(ValueError):
                if self.swarm.seeding(info_hash(offer.torrent)):
                    return Path(files.data)
        await self._publish(key, url, files.data, *current)
        return Path(files.data)

    async def _publish(
        self,
        key: str,
        url: str,
        data: Path,
        size: int,
        etag: str | None,
        modified: str | None,
        torrent: bytes | None = None,
    ) -> None:
        """Seed a committed file and show its torrent in the model's manifest; ``torrent``:
        the followed node's for these very bytes, else it is made (hashing the file)."""
        name = file_name(url)
        try:
            if torrent is None:
                torrent = await run_blocking(
                    self._lane, lambda: make_torrent(data, torrent_name(name))
                )
            await self.swarm.seed(torrent, data)
        except (OSError, LoaderError) as exc:
            logger.warning("%s: not offered to peers: %s", url, exc)
            return
        key_of = info_hash(torrent)
        old = await run_blocking(self._looks, lambda: self.held.add(key, name, key_of, data))
        if old is not None:
            await self.swarm.remove(old.info_hash)  # a new version of the file
        manifest = self.manifests.get(key)
        # Its ranges stay listed (and seeded, ranged.py): a node still fetching one
        # finds it.
        was = manifest.file(name) if manifest is not None else None
        ranges = was.ranges if was is not None and was.size == size else ()
        offer = FileOffer(name, url, size, etag, modified, size, torrent, key_of, ranges)
        if manifest is not None:
            self.manifests[key] = manifest.with_file(offer)
        logger.info("offering %s to peers (%s)", name, info_hash(torrent)[:12])

    async def _seed_all(self, key: str, cached: CachedModel) -> None:
        manifest = self.manifests[key]
        for url, path in cached.files.items():
            offer = manifest.file(file_name(url))
            if offer is not None and offer.torrent is not None:
                with contextlib.suppress(ValueError):
                    if self.swarm.seeding(info_hash(offer.torrent)):
                        continue
            data = Path(path)
            size, etag, modified = await run_blocking(self._lane, partial(_version, data))
            await self._publish(key, url, data, size, etag, modified)


def _version(data: Path) -> tuple[int, str | None, str | None]:
    """The size of ``data``, and the (etag, last_modified) its entry records."""
    size = data.stat().st_size
    try:
        meta = json.loads((data.parent / "meta.json").read_text())
    except (OSError, ValueError):
        return size, None, None
    etag, modified = meta.get("etag"), meta.get("last_modified")
    return size, _text(etag), _text(modified)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
