"""Google Cloud Storage: ``gs://bucket/object``, range reads through the HTTP transport.

Objects are read with the JSON API's media download, pinned to the object's
*generation*: opening a file asks for its metadata (size, generation), and every
range read names that generation, so a file overwritten during a load fails
(404 for the old generation) instead of mixing two versions. The generation is
also the version the node cache keys an entry on. A file read whole is checked
against the ``crc32c`` the metadata gives (or its ``md5Hash`` where that is the only
one: a composed object has no MD5), see digests.py and verifying.py.

Credentials: see signer.py.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from ...errors import SourceError
from ...redact import redact
from ...runtime.threads import Lanes
from ...runtime.throttle import LimiterStatistics
from ...settings.values import HttpOptions
from ..base import Blob, Source
from ..digests import gcs_digest
from ..http.listing import listed, prefix_to_list
from ..http.store import HttpStore
from ..verifying import verifying
from .blob import GcsBlob
from .signer import GcsSigner
from .url import api_url, split_gs_url

__all__ = ["GcsSource"]


class GcsSource(Source):
    """Objects in Google Cloud Storage (see the module docstring).

    Args:
        lanes: the owner's threads; ``lanes.concurrency`` requests in flight at most.
        http: retries and timeouts.
    """

    scheme_name = "GCS"

    def __init__(self, lanes: Lanes, http: HttpOptions | None = None) -> None:
        self._lanes = lanes
        self._signer = GcsSigner(lanes.setup)
        self._store = HttpStore(type(self).__name__, lanes, http or HttpOptions(), self._signer)

    def __repr__(self) -> str:
        return f"<GcsSource endpoint={self._signer.endpoint}>"

    def statistics(self) -> LimiterStatistics:
        return self._store.statistics()

    def _api(self, bucket: str, key: str = "", *, download: bool = False) -> str:
        return api_url(self._signer.endpoint, bucket, key, download=download)

    async def _get_json(self, url: str, fetch_url: str, missing: str, what: str) -> dict[str, Any]:
        body = await self._store.read_body(url, fetch_url, lambda _: missing)
        try:
            document = json.loads(body)
        except ValueError as exc:  # UnicodeDecodeError too
            raise self._broken(url, what, f"it is not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise self._broken(url, what, f"it is a JSON {type(document).__name__}, not an object")
        return document

    def _broken(self, url: str, what: str, problem: str) -> SourceError:
        hint = (
            "check that STORAGE_EMULATOR_HOST points at a Cloud Storage emulator"
            if self._signer.emulator
            else "a proxy or captive portal may stand between; check the network path"
        )
        return SourceError(
            f"{redact(url)}: the {what} that {self._signer.endpoint} sent is not Cloud "
            f"Storage's: {problem}; {hint}"
        )

    async def list_dir(self, url: str) -> list[str] | None:
        await self._signer.setup()
        bucket, key = split_gs_url(url)
        prefix = prefix_to_list(key)
        if prefix is None:
            return None
        names: list[str] = []
        token = None
        while True:
            fields = "items(name),prefixes,nextPageToken"
            params = {"prefix": prefix, "delimiter": "/", "fields": fields}
            if token:
                params["pageToken"] = token
            page = await self._get_json(
                url,
                f"{self._api(bucket)}?{urlencode(params)}",
                f"{url}: bucket {bucket!r} does not exist at {self._signer.endpoint}",
                "listing",
            )
            items = page.get("items", [])
            if not isinstance(items, list) or not all(
                isinstance(i, dict) and isinstance(i.get("name"), str) for i in items
            ):
                raise self._broken(url, "listing", "its items are not objects with a name")
            names += [i["name"][len(prefix) :] for i in items if i["name"] != prefix]
            folders = page.get("prefixes", [])  # sub-folders: "<prefix>sub/"
            if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
                raise self._broken(url, "listing", "its prefixes are not strings")
            names += [f[len(prefix) :] for f in folders if f.startswith(prefix) and f != prefix]
            token = page.get("nextPageToken")
            if token is not None and not isinstance(token, str):
                raise self._broken(url, "listing", "its nextPageToken is not a string")
            if not token:
                return listed(names, key)

    async def open(self, url: str) -> Blob:
        await self._signer.setup()
        bucket, key = split_gs_url(url)
        if not key:
            raise SourceError(f"{url} names a bucket, not an object or a prefix/")
        meta = await self._get_json(
            url,
            self._api(bucket, key) + "?fields=generation,size,crc32c,md5Hash",
            f"{url} does not exist at {self._signer.endpoint}; check the bucket and object name",
            "object metadata",
        )
        generation = str(meta.get("generation", ""))
        if not (generation.isascii() and generation.isdigit()):
            raise self._broken(url, "object metadata", "it gives no generation number")
        fetch_url = (
            self._api(bucket, key, download=True)
            + "?"
            + urlencode({"alt": "media", "generation": generation})
        )
        blob = GcsBlob(await self._store.open(url, fetch_url), generation)
        digest = gcs_digest(meta, f"Cloud Storage ({self._signer.endpoint})")
        return verifying(blob, digest, self._lanes.digest)

    async def aclose(self) -> None:
        await self._store.aclose()
