"""The Cloud Storage emulator and Azurite as fixtures, for the test modules of each
store (imported by name: each module gets its own server, module-scoped)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .azure_server import AzuriteServer
from .servers import GcsEmulator

__all__ = ["account", "azurite", "emulator", "gcs"]


@pytest.fixture(scope="module")
def emulator() -> Iterator[GcsEmulator]:
    with GcsEmulator() as server:
        yield server


@pytest.fixture
def gcs(emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> GcsEmulator:
    """``emulator``, with ``STORAGE_EMULATOR_HOST`` pointing at it."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.endpoint)
    return emulator


@pytest.fixture(scope="module")
def azurite() -> Iterator[AzuriteServer]:
    with AzuriteServer() as server:
        yield server


@pytest.fixture
def account(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> AzuriteServer:
    """``azurite``, its connection string the only Azure credential in the environment."""
    for name in (
        "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_ACCOUNT_NAME",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    return azurite
