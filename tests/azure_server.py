"""Azurite (Microsoft's Azure Storage emulator) on 127.0.0.1 for tests: ``AzuriteServer``.

Installed by scripts/azurite_setup.sh into .azurite/. It runs as a child process,
in memory, on a port the OS picked, with Azurite's well-known development account
(``devstoreaccount1``); ``connection_string`` is what a user would set in
``AZURE_STORAGE_CONNECTION_STRING``. Found by experiment (Azurite 3.35.0): range
GETs answer 206 with a strong ``ETag``, ``If-Match`` is honoured, listing by
prefix and delimiter works, and SAS tokens and Shared Key are checked.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Self

from .lifetime import StartStop

__all__ = ["AZURITE", "AzuriteServer"]

AZURITE = (
    Path(__file__).resolve().parents[1] / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
)
ACCOUNT = "devstoreaccount1"
# Azurite's published development key (the same in every installation; not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class AzuriteServer(StartStop):
    """Use as ``with AzuriteServer() as azurite:``."""

    def __init__(self) -> None:
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self._process = subprocess.Popen(
            [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--inMemoryPersistence", "--skipApiVersionCheck", "--silent", "--loose"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("Azurite did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            self._process = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    def client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def upload(self, container: str, prefix: str, folder: Path) -> list[str]:
        """Every file of ``folder`` as ``prefix/<name>`` (the container is made if missing)."""
        service = self.client()
        box = service.get_container_client(container)
        if not box.exists():
            box.create_container()
        names = []
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            name = f"{prefix}/{path.name}" if prefix else path.name
            box.upload_blob(name, path.read_bytes(), overwrite=True)
            names.append(name)
        return names
