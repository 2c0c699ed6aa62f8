from __future__ import annotations

import gc
import os
import shutil
import threading
from collections.abc import Iterator

import pytest

from aioloader.runtime.threads import PER_PROCESS, lane_of


def _lane_threads() -> list[str]:
    """aioloader's threads but those of the process-wide lanes (threads.py), which
    finish a load's cache writes after it on purpose."""
    names = [t.name for t in threading.enumerate()]
    return [n for n in names if lane_of(n) is not None and lane_of(n) not in PER_PROCESS]


@pytest.fixture(autouse=True)
def hf_home_of_its_own(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """hf:// loads write the Hugging Face cache by default: never the machine's own (nor
    another test's), and never with the machine's own login token. Tests that need
    another set them after. The folder goes when the test ends."""
    home = tmp_path_factory.mktemp("hf-home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_TOKEN_PATH", str(home / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test leaves no thread of a lane and no file descriptor behind: each
    Loader, fetch and device closed the lanes it started."""
    fds_before = set(os.listdir("/proc/self/fd"))
    yield
    gc.collect()
    assert _lane_threads() == [], "threads left running"
    leaked = []
    for fd in set(os.listdir("/proc/self/fd")) - fds_before:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".safetensors") or target.endswith(".json"):
            leaked.append(target)
    assert leaked == [], f"file descriptors left open: {leaked}"


from .fixtures_hub import hub  # noqa: E402, F401
from .fixtures_remote import http_server, moto_auth_server, moto_server, s3_env  # noqa: E402, F401
from .fixtures_stores import account, azurite, emulator, gcs  # noqa: E402, F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests run only where torch sees a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
