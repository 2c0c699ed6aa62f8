"""The Hugging Face Hub as a source: ``hf://org/name@revision/path``, read into memory.

Before any byte is read, the revision is resolved to one commit and the files at
that commit are listed (hub.py, through huggingface_hub); the URLs of the files a
folder's layout names carry that commit, so a branch that moves mid-load cannot
mix two versions. Bytes come from the Hub's ``resolve/<commit>/<path>`` URLs
through the shared HTTP machinery (ranges, retries, pinned ETags), following the
redirect to the storage host; the token goes to the Hub only (signer.py).

A long-lived Loader keeps one HfSource: each load of a branch or tag resolves it
again, and the files it then joins are read at that commit.
"""

from __future__ import annotations

from collections import OrderedDict
from urllib.parse import quote

from ...config import HttpOptions
from ...errors import ClosedError, SourceError
from ...threads import Lanes, run_in
from ...throttle import LimiterStatistics
from ..base import Blob, Source
from ..http.store import HttpStore
from .hub import HubSettings, resolve_snapshot
from .signer import HubSigner
from .snapshot import Snapshot
from .url import HfLocation, is_commit, parse_hf_url

__all__ = ["HfSource"]

# Snapshots of commits kept for the files a layout joins (a commit never changes).
_KEPT_SNAPSHOTS = 64


class HfSource(Source):
    """Model repositories on the Hugging Face Hub (see the module docstring).

    The Hub's settings (endpoint, token, offline) are read on first use, in the
    ``setup`` lane, as are huggingface_hub's calls (they block); a missing
    huggingface_hub is a ConfigError then (``aioloader[hf]``).

    Args:
        lanes: the owner's threads; ``lanes.concurrency`` requests in flight at most.
        http: retries and timeouts.
    """

    scheme_name = "Hugging Face Hub"

    def __init__(self, lanes: Lanes, http: HttpOptions | None = None) -> None:
        self._lanes = lanes
        self._signer = HubSigner()
        self._store = HttpStore(type(self).__name__, lanes, http or HttpOptions(), self._signer)
        self._settings: HubSettings | None = None
        self._snapshots: OrderedDict[tuple[str, str], Snapshot] = OrderedDict()
        self._pins: dict[tuple[str, str], str] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"<HfSource {self._settings!r} {self._store!r}>"

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    async def _snapshot(self, location: HfLocation) -> Snapshot:
        if self._closed:
            raise ClosedError("this HfSource is closed")
        settings = self._settings
        if settings is None:
            settings = self._settings = await run_in(self._lanes.setup, HubSettings.from_env)
            self._signer.use(settings)
        settings.check_online(location.url())
        key = (location.repo_id, location.revision)
        if is_commit(location.revision) and key in self._snapshots:
            return self._snapshots[key]
        snapshot = await run_in(self._lanes.setup, resolve_snapshot, settings, location)
        self._snapshots[(snapshot.repo_id, snapshot.sha)] = snapshot
        while len(self._snapshots) > _KEPT_SNAPSHOTS:
            self._snapshots.popitem(last=False)
        if not is_commit(location.revision):
            self._pins[key] = snapshot.sha
        return snapshot

    async def list_dir(self, url: str) -> list[str] | None:
        location = parse_hf_url(url)
        return (await self._snapshot(location)).names_in(location.path)

    async def open(self, url: str) -> Blob:
        location = parse_hf_url(url)
        snapshot = await self._snapshot(location)
        size = snapshot.size_of(location.path)
        assert self._settings is not None
        fetch_url = (
            f"{self._settings.endpoint}/{quote(location.repo_id)}/resolve/{snapshot.sha}/"
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
        return blob

    def join(self, base: str, name: str) -> str:
        # Files named after a listing are read at the commit the listing saw.
        location = parse_hf_url(base)
        sha = self._pins.get((location.repo_id, location.revision), location.revision)
        path = f"{location.path}/{name}" if location.path else name
        return location.at(revision=sha, path=path).url()

    async def aclose(self) -> None:
        self._closed = True
        await self._store.aclose()
