"""Fixtures for tests against real local servers (see tests/servers.py).

Import them into a conftest with ``from .fixtures_remote import *`` (or by name).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import FaultyHttpServer, MotoS3Server

__all__ = ["http_server", "moto_auth_server", "moto_server", "s3_env"]


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[FaultyHttpServer]:
    """A FaultyHttpServer over the fresh, empty folder ``tmp_path / "www"``."""
    root = tmp_path / "www"
    root.mkdir()
    with FaultyHttpServer(root) as server:
        yield server


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoS3Server]:
    """One moto S3 server for the session, signatures not checked.

    moto keeps its buckets in process-wide state, so tests should use bucket names of
    their own rather than expect an empty server.
    """
    with MotoS3Server() as server:
        yield server


@pytest.fixture
def s3_env(
    moto_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> MotoS3Server:
    """``moto_server``, with the AWS_* environment pointing at it and at nothing else."""
    moto_server.set_env(monkeypatch, tmp_path)
    return moto_server


@pytest.fixture
def moto_auth_server() -> Iterator[MotoS3Server]:
    """A moto S3 server that checks SigV4 signatures, for this test only.

    Enforcement is process-wide in moto: while this fixture is active, requests to
    ``moto_server`` signed with the "testing" key fail too. It is switched off on exit.
    Sign with ``server.credentials`` (``client()`` and ``set_env()`` do).
    """
    with MotoS3Server(enforce_auth=True) as server:
        yield server
