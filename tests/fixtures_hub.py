"""The ``hub`` fixture: a local Hugging Face Hub (tests/hub_server.py) that hf:// URLs reach.

Registered in conftest.py; a test module that needs another set-up defines its own ``hub``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["hub"]


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A ``LocalHub`` in ``tmp_path``, with HF_ENDPOINT at it, no token, online, and the
    Hugging Face cache in ``tmp_path / "hf-cache"``."""
    pytest.importorskip("huggingface_hub")
    from .hub_server import LocalHub

    with LocalHub(tmp_path) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        # No token file of the machine's own login may reach the local Hub.
        monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
        yield server
