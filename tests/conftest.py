from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest


def _reader_threads() -> list[threading.Thread]:
    prefixes = ("aioloader-read", "aioloader-copy", "aioloader-exchange")
    return [t for t in threading.enumerate() if t.name.startswith(prefixes)]


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test leaves no reader thread and no file descriptor behind."""
    fds_before = set(os.listdir("/proc/self/fd"))
    yield
    gc.collect()
    assert _reader_threads() == [], "reader threads left running"
    leaked = []
    for fd in set(os.listdir("/proc/self/fd")) - fds_before:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".safetensors") or target.endswith(".json"):
            leaked.append(target)
    assert leaked == [], f"file descriptors left open: {leaked}"


from .fixtures_remote import http_server, moto_auth_server, moto_server, s3_env  # noqa: E402, F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests run only where torch sees a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
