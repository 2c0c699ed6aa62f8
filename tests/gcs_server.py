"""gcp-storage-emulator behind a real local endpoint for tests: ``GcsEmulator``.

It listens on 127.0.0.1 on a port the OS picks and serves from a background
thread, in memory. Found by experiment (gcp-storage-emulator 2026.7.19): media
downloads honour ``Range: bytes=a-b`` and ``bytes=a-`` and answer 206 with
``Content-Range``, but send no ``ETag`` and no ``x-goog-generation``, and ignore
``If-Match`` and ``ifGenerationMatch``; listing with ``prefix`` and ``delimiter``
works; nothing checks credentials.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlencode

from .lifetime import StartStop

__all__ = ["GcsEmulator"]


class GcsEmulator(StartStop):
    """Use as ``with GcsEmulator() as gcs:``; ``gcs.endpoint`` is its base URL."""

    def __init__(self) -> None:
        self._server: Any = None
        self.port = 0

    def start(self) -> Self:
        from gcp_storage_emulator.server import create_server

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self._server = create_server("127.0.0.1", self.port, in_memory=True)
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _request(self, method: str, path: str, body: bytes, content_type: str) -> Any:
        request = urllib.request.Request(
            self.endpoint + path, data=body, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read() or b"{}")

    def create_bucket(self, bucket: str) -> None:
        self._request(
            "POST", "/storage/v1/b", json.dumps({"name": bucket}).encode(), "application/json"
        )

    def put(self, bucket: str, name: str, body: bytes) -> Any:
        query = urlencode({"uploadType": "media", "name": name})
        return self._request(
            "POST",
            f"/upload/storage/v1/b/{quote(bucket)}/o?{query}",
            body,
            "application/octet-stream",
        )

    def compose(self, bucket: str, name: str, sources: list[str]) -> Any:
        """``name`` made of ``sources`` back to back, as Cloud Storage's compose makes it.

        The emulator gives a composed object an ``md5Hash`` too; Cloud Storage does not
        (it has no MD5 of the whole), so it is taken out here: ``crc32c`` alone is left.
        """
        body = json.dumps(
            {"sourceObjects": [{"name": n} for n in sources], "destination": {}}
        ).encode()
        path = f"/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}/compose"
        made = self._request("POST", path, body, "application/json")
        self.stored(bucket, name).pop("md5Hash", None)
        return made

    def stored(self, bucket: str, name: str) -> dict[str, Any]:
        """The emulator's own metadata of an object (changes to it are served)."""
        return self._server._storage.objects[bucket][name]  # type: ignore[no-any-return]

    def change_byte(self, bucket: str, name: str, at: int) -> None:
        """Flip the stored byte at ``at``; the metadata (its checksums) stays."""
        storage = self._server._storage
        path = storage._object_path(bucket, name)
        data = bytearray(storage._store.read_bytes(path))
        data[at] ^= 0xFF
        storage._store.write_bytes(path, bytes(data))

    def upload(self, bucket: str, prefix: str, folder: Path) -> list[str]:
        """Every file of ``folder`` as ``prefix/<name>`` (the bucket is made if missing)."""
        try:
            self.create_bucket(bucket)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise
        names = []
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            name = f"{prefix}/{path.name}" if prefix else path.name
            self.put(bucket, name, path.read_bytes())
            names.append(name)
        return names
