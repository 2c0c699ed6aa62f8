"""The Hugging Face Hub as a source: ``hf://org/name@revision/path``, read into memory.

Before any byte is read, the revision is resolved to one commit and the files at
that commit are listed (hub.py, through huggingface_hub); the URLs of the files a
folder's layout names carry that commit, so a branch that moves mid-load cannot
mix two versions. Bytes come from the Hub's ``resolve/<commit>/<path>`` URLs
through the shared HTTP machinery (ranges, retries, pinned ETags), following the
redirect to the storage host; the token goes to the Hub only (signer.py).

A long-lived Loader keeps one HfSource: each load of a branch or tag resolves it
again, and the files it then joins are read at that commit. A branch or tag the
hub cache holds is asked about under a deadline, and read at its cached commit
when the Hub gives no answer (revision.py).

A file the Hugging Face hub cache already holds at that commit (written by
aioloader or by huggingface_hub) is read from there, as a local file. With
``HF_HUB_OFFLINE`` set the Hub is never asked: the revision and the files come
from the cache (hf_cache.py), and what it lacks is a NotFoundError saying so.
Filling the cache is sinks/hf/cache_writes.py's.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import quote

from ...errors import ClosedError, SourceError
from ...format.names import shown
from ...redact import redacting_logger
from ...runtime.threads import Lanes, run_in
from ...runtime.throttle import LimiterStatistics
from ...settings.values import HttpOptions
from ..base import Blob, Source
from ..digests import Digest, hub_digest
from ..file import FileSource
from ..http.store import HttpStore
from ..verifying import verifying
from .hf_cache import HfCache
from .hub import HubSettings, resolve_snapshot
from .revision import NoAnswer, RevisionCheck, ask_commit
from .signer import HubSigner
from .snapshot import Snapshot
from .tree import bad_path
from .url import HfLocation, is_commit, parse_hf_url, reads_back

__all__ = ["HfFile", "HfSource"]

logger = redacting_logger(__name__)

# Snapshots of commits kept for the files a layout joins (a commit never changes).
_KEPT_SNAPSHOTS = 64
# Places on the Hub kept by their URL: those handed in (``know``) and those joined.
_KEPT_PLACES = 1024


@dataclass(frozen=True)
class HfFile:
    """A file of a Hub repository, opened.

    Attributes:
        blob: its bytes, from the network or from the hub cache.
        cached: whether ``blob`` reads the hub cache's copy.
        path: its path in the repository.
        snapshot: the commit it belongs to.
        settings: the Hub's settings it was opened with.
    """

    blob: Blob
    cached: bool
    path: str
    snapshot: Snapshot
    settings: HubSettings


class HfSource(Source):
    """Model repositories on the Hugging Face Hub (see the module docstring).

    The Hub's settings (endpoint, token, offline) are read on first use, in the
    ``setup`` lane, as are huggingface_hub's calls (they block); a missing
    huggingface_hub is a ConfigError then (``aioloader[hf]``).

    Args:
        lanes: the owner's threads; ``lanes.concurrency`` requests in flight at most.
        http: retries and timeouts.
        check: how a branch or tag the hub cache holds is checked (revision.py).
    """

    scheme_name = "Hugging Face Hub"

    def __init__(
        self, lanes: Lanes, http: HttpOptions | None = None, check: RevisionCheck | None = None
    ) -> None:
        self._lanes = lanes
        self._check = check or RevisionCheck()
        self._signer = HubSigner()
        self._store = HttpStore(type(self).__name__, lanes, http or HttpOptions(), self._signer)
        self._settings: HubSettings | None = None
        self._online: HubSettings | None = None
        self._snapshots: OrderedDict[tuple[str, str], Snapshot] = OrderedDict()
        self._pins: dict[tuple[str, str], str] = {}
        self._places: OrderedDict[str, HfLocation] = OrderedDict()
        self._local: FileSource | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<HfSource {self._settings!r} {self._store!r}>"

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    async def _settings_now(self) -> HubSettings:
        if self._closed:
            raise ClosedError("this HfSource is closed")
        settings = self._settings
        if settings is None:
            settings = self._settings = await run_in(self._lanes.setup, HubSettings.from_env)
        return settings

    async def _online_settings(self) -> HubSettings:
        """The settings with the token, for a request to the Hub (see HubSettings.with_token)."""
        settings = self._online
        if settings is None:
            offline = await self._settings_now()
            settings = self._online = await run_in(self._lanes.setup, offline.with_token)
            self._signer.use(settings)
        return settings

    async def _snapshot(self, location: HfLocation) -> Snapshot:
        settings = await self._settings_now()
        key = (location.repo_id, location.revision)
        if is_commit(location.revision) and key in self._snapshots:
            return self._snapshots[key]
        cache = HfCache(settings.cache, location.repo_id)
        if settings.offline:
            snapshot = await run_in(self._lanes.setup, cache.snapshot, location)
        else:
            kept = await cache.load_tree(location.revision, self._lanes.setup)
            if kept is not None:  # a commit whose listing is cached: nothing to ask
                sha = location.revision
                snapshot = Snapshot.of_tree(location.repo_id, sha, sha, kept)
            else:
                snapshot = await self._resolve(location, cache)
        self._keep(snapshot)
        if not is_commit(location.revision):
            self._pins[key] = snapshot.sha
        return snapshot

    async def _resolve(self, location: HfLocation, cache: HfCache) -> Snapshot:
        """``location``'s revision resolved by the Hub, with the commit's files. One the
        hub cache holds is asked about under a deadline, and is its cached commit when
        the Hub gives no answer (revision.py)."""
        cached = None
        if not is_commit(location.revision):
            cached = await cache.load_snapshot(location.revision, self._lanes.setup)
        sha = None
        if cached is not None:
            sha = await self._ask(location, cached.sha)
            if sha == cached.sha:
                return dataclasses.replace(cached, revision=location.revision)
        return await self._from_hub(location, cache, sha)

    async def _from_hub(self, location: HfLocation, cache: HfCache, sha: str | None) -> Snapshot:
        """huggingface_hub's answer: the commit ``sha``'s files, or the revision resolved
        and its errors named as for a load (hub.py)."""
        online = await self._online_settings()
        return await run_in(self._lanes.setup, resolve_snapshot, online, location, cache, sha)

    async def _ask(self, location: HfLocation, cached: str) -> str | None:
        """The commit the Hub says ``location``'s revision is at; ``cached`` when it gives
        no answer (or, demanding freshness, an error); None when it answered something
        else, which huggingface_hub then names."""
        settings = await self._online_settings()
        try:
            return await ask_commit(self._store, settings, location, self._check)
        except NoAnswer as silence:
            return self._check.settle(settings, location, cached, silence)

    async def cached_commit(self, location: HfLocation) -> str | None:
        """The commit the hub cache last saw ``location``'s branch or tag at, when it
        holds that commit's listing too; None for a commit sha, offline, or nothing cached."""
        settings = await self._settings_now()
        if settings.offline or is_commit(location.revision):
            return None
        cache = HfCache(settings.cache, location.repo_id)
        snapshot = await cache.load_snapshot(location.revision, self._lanes.setup)
        if snapshot is None:
            return None
        self._keep(snapshot)  # the load of that commit finds its listing here
        return snapshot.sha

    async def current_commit(self, location: HfLocation, cached: str) -> str:
        """The commit ``location``'s revision points to now: the Hub's answer, or ``cached``
        (the hub cache's commit for it) when the Hub gives no answer in time.

        Asked with one GET of the revision's API page on the event loop (revision.py),
        since it runs beside a warm load (warm_start.py), where huggingface_hub's
        client in a thread fought the load's threads for the CPU and took up to ten
        times as long. Any answer but a commit sha is asked again through
        huggingface_hub, which names the error as a load would.

        Raises:
            SourceError: as for a load (access, a missing repository or revision); no
                answer while freshness is demanded (``RevisionCheck.fresh``).
        """
        sha = await self._ask(location, cached)
        if sha is not None:
            return sha
        settings = await self._settings_now()
        snapshot = await self._from_hub(location, HfCache(settings.cache, location.repo_id), None)
        self._keep(snapshot)
        return snapshot.sha

    def _keep(self, snapshot: Snapshot) -> None:
        odd = snapshot.left_out
        if odd and (snapshot.repo_id, snapshot.sha) not in self._snapshots:
            # Each name with its own reason, cut short: a 5000-character name is "too
            # long", not "a backslash", and must not fill the log line.
            named = [f"{shown(path)} ({bad_path(path)})" for path in odd[:5]]
            logger.warning(
                "%s at %s: %d file(s) left out of what aioloader loads and fetches, their "
                "names not ones it makes files of: %s (huggingface_hub downloads them)",
                snapshot.repo_id,
                snapshot.sha[:12],
                len(odd),
                ", ".join(named) + (", ..." if len(odd) > 5 else ""),
            )
        self._snapshots[(snapshot.repo_id, snapshot.sha)] = snapshot
        while len(self._snapshots) > _KEPT_SNAPSHOTS:
            self._snapshots.popitem(last=False)

    def know(self, url: str, place: HfLocation) -> None:
        """``url``'s place on the Hub, parsed already (a ``Location``'s, stores.py): the
        reads of ``url`` take it rather than parse the URL again."""
        self._places[url] = place
        self._places.move_to_end(url)
        while len(self._places) > _KEPT_PLACES:
            self._places.popitem(last=False)

    def _place(self, url: str) -> HfLocation:
        """``url``'s place: as handed in or joined here, else parsed (a URL from elsewhere)."""
        place = self._places.get(url)
        return parse_hf_url(url) if place is None else place

    async def list_dir(self, url: str) -> list[str] | None:
        location = self._place(url)
        return (await self._snapshot(location)).names_in(location.path)

    async def open(self, url: str) -> Blob:
        return (await self.open_file(url)).blob

    async def open_file(self, url: str) -> HfFile:
        """Open ``url``: from the hub cache when it holds the file at the resolved
        commit, else from the Hub.

        Raises:
            NotFoundError: no such file at that commit (offline: not in the cache).
            SourceError: the Hub's download is not the size its listing gave.
        """
        location = self._place(url)
        snapshot = await self._snapshot(location)
        settings = await self._settings_now()
        cache = HfCache(settings.cache, location.repo_id)
        if settings.offline and location.path not in snapshot.files:
            raise cache.missing_offline(location, snapshot.sha)
        size = snapshot.size_of(location.path)
        local = await run_in(self._lanes.setup, cache.find, snapshot.sha, location.path, size)
        if local is None and settings.offline:
            raise cache.missing_offline(location, snapshot.sha)
        if local is not None:
            if self._local is None:
                self._local = FileSource(self._lanes)
            blob = await self._local.open(str(local))
            blob.url = url  # a layout matches the files it joins by their hf:// URLs
            return HfFile(blob, True, location.path, snapshot, settings)
        settings = await self._online_settings()
        fetch_url = (
            f"{settings.endpoint}/{quote(location.repo_id)}/resolve/{snapshot.sha}/"
            + quote(location.path)
        )
        blob = await self._store.open(url, fetch_url)
        if blob.size != size:
            await blob.aclose()
            raise SourceError(
                f"{url}: the Hub lists {size} bytes for {location.path!r} at {snapshot.sha}, "
                f"but its download has {blob.size}; try again, and report it to the Hub if "
                "it persists"
            )
        # Checked against the listing's blob id as it arrives (sources/verifying.py).
        where = f"{location.path!r} in {snapshot.describe()}"
        digest = hub_digest(snapshot.ids.get(location.path, ""), size, where)
        blob = verifying(blob, digest, self._lanes.digest)
        return HfFile(blob, False, location.path, snapshot, settings)

    async def publisher_digest(self, url: str) -> Digest | None:
        """The blob id the Hub lists for ``url`` at its commit (the LFS sha256 of a weight
        file, the git blob sha1 of a small one): from the listing, no file bytes."""
        location = self._place(url)
        snapshot = await self._snapshot(location)
        if location.path not in snapshot.files:
            return None
        where = f"{location.path!r} in {snapshot.describe()}"
        size = snapshot.size_of(location.path)
        return hub_digest(snapshot.ids.get(location.path, ""), size, where)

    def parent(self, url: str) -> str:
        folder = super().parent(url)
        place = self._places.get(url)
        if place is not None and place.path:  # the folder of a place known: known too
            up = place.at(path=place.path.rpartition("/")[0])
            if up.url() == folder and reads_back(up, folder):
                self.know(folder, up)
        return folder

    def join(self, base: str, name: str) -> str:
        # Files named after a listing are read at the commit the listing saw.
        location = self._place(base)
        sha = self._pins.get((location.repo_id, location.revision), location.revision)
        path = f"{location.path}/{name}" if location.path else name
        joined = location.at(revision=sha, path=path)
        url = joined.url()
        if reads_back(joined, url):
            self.know(url, joined)
        return url

    async def aclose(self) -> None:
        self._closed = True
        try:
            await self._store.aclose()
        finally:
            if self._local is not None:
                await self._local.aclose()
