"""A node that holds a branch in the hub cache starts it while the Hub gives no answer.

The Hub is asked where the branch is under ``hf_revision_timeout`` for the whole
question; a Hub that accepts and never answers, refuses connections or answers
5xx on every attempt leaves the cached commit to be loaded, with a warning
(``hf_fresh`` makes it an error). A real answer (401, 403, 404) stays the load's
error. The local Hub (tests/hub_server.py) plays every part; every tensor is
compared bit for bit with safetensors.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aioloader import (
    AccessDeniedError,
    ConfigError,
    Loader,
    NotFoundError,
    SourceError,
    load_model,
)
from aioloader.settings.options import LoadOptions

from . import test_hf
from .helpers import assert_matches_files, some_big, write_sharded
from .hub_server import LocalHub

hub = test_hf.hub  # the local Hub fixture; its hub cache is tmp_path / "hf-cache"
hf = pytest.importorskip("huggingface_hub")

REPO = "org/model"
STALE = "may be out of date"
# Far beyond what a fixed load takes (about hf_revision_timeout), far below what a
# load that waits on the Hub takes (30 s a stalled attempt, six attempts).
GUARD = 25


def _cached(tmp_path: Path, hub: LocalHub, seed: int = 1) -> tuple[str, list[Path]]:
    """A commit on ``main``, filled into the hub cache by huggingface_hub."""
    folder = tmp_path / f"src-{seed}"
    write_sharded(folder, some_big(seed), shards=2)
    (folder / "config.json").write_text('{"model_type": "test"}')
    sha = hub.commit(REPO, test_hf._files(folder))
    hf.snapshot_download(REPO, cache_dir=tmp_path / "hf-cache", endpoint=hub.url, token=False)
    return sha, sorted(folder.glob("*.safetensors"))


def _stale_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if STALE in r.getMessage()]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_cached_branch_starts_while_the_hub_never_answers(
    hub: LocalHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sha, shards = _cached(tmp_path, hub)
    hub.hang.add("/revision/")
    monkeypatch.setenv("AIOLOADER_HF_REVISION_TIMEOUT", "1")
    stored, before = len(hub.storage.requests), len(hub.log)
    caplog.set_level(logging.WARNING)
    async with asyncio.timeout(GUARD):
        assert_matches_files(await load_model(f"hf://{REPO}"), *shards)
        async with Loader() as loader:
            # A stream, and inspect (vLLM's way in), ask before they read: bounded too.
            got = {}
            async with loader.stream(f"hf://{REPO}@main") as stream:
                async for name, tensor in stream:
                    got[name] = tensor
            assert_matches_files(got, *shards)
            info = await loader.inspect(f"hf://{REPO}")
            assert [f.rsplit("/", 1)[-1] for f in info.layout.files] == [s.name for s in shards]
    warnings = _stale_warnings(caplog)
    assert len(warnings) == 3
    assert f"hf://{REPO}@main" in warnings[0] and sha[:12] in warnings[0]
    assert "hf_revision_timeout" in warnings[0] and "hf_fresh" in warnings[0]
    assert len(hub.storage.requests) == stored, "everything came from the cache"
    asked = [r.path for r in hub.log[before:]]
    assert asked == [f"/api/models/{REPO}/revision/main"] * 3, "one question a load"


async def test_a_cached_branch_starts_while_the_hub_refuses_connections(
    hub: LocalHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sha, shards = _cached(tmp_path, hub)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    caplog.set_level(logging.WARNING)
    async with asyncio.timeout(GUARD):
        got = await load_model(f"hf://{REPO}", max_attempts=2, backoff=0.01)
    assert_matches_files(got, *shards)
    (warning,) = _stale_warnings(caplog)
    assert sha[:12] in warning and "every attempt failed" in warning


def test_the_command_line_starts_a_cached_branch_with_the_hub_away(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha, _ = _cached(tmp_path, hub)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", f"hf://{REPO}", "--max-attempts", "2",
         "--backoff", "0.01", "--json"],
        capture_output=True, text=True, timeout=GUARD, env=os.environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert STALE in done.stderr and sha[:12] in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", f"hf://{REPO}", "--max-attempts", "2",
         "--backoff", "0.01", "--hf-fresh", "1"],
        capture_output=True, text=True, timeout=GUARD, env=os.environ,
    )  # fmt: skip
    assert done.returncode != 0 and "hf_fresh is set" in done.stderr


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_a_hub_failing_every_attempt_is_no_answer(
    hub: LocalHub, tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    _, shards = _cached(tmp_path, hub)
    hub.statuses["/revision/"] = status
    caplog.set_level(logging.WARNING)
    async with asyncio.timeout(GUARD):
        got = await load_model(f"hf://{REPO}", max_attempts=2, backoff=0.01)
    assert_matches_files(got, *shards)
    (warning,) = _stale_warnings(caplog)
    assert f"HTTP {status}" in warning


async def test_hf_fresh_fails_rather_than_load_the_cached_commit(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha, _ = _cached(tmp_path, hub)
    hub.hang.add("/revision/")
    async with asyncio.timeout(GUARD):
        with pytest.raises(SourceError, match="hf_fresh is set") as info:
            await load_model(f"hf://{REPO}", hf_fresh=True, hf_revision_timeout=0.5)
        assert f"hf://{REPO}@main" in str(info.value) and sha[:12] in str(info.value)
        monkeypatch.setenv("AIOLOADER_HF_FRESH", "1")
        monkeypatch.setenv("AIOLOADER_HF_REVISION_TIMEOUT", "0.5")
        async with Loader() as loader:
            with pytest.raises(SourceError, match="hf_fresh is set"):
                async with loader.stream(f"hf://{REPO}") as stream:
                    async for _ in stream:
                        pass


async def test_the_hubs_answers_stay_errors_when_cached(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cached(tmp_path, hub)
    # 403: a gated repository whose licence this token's account has not accepted.
    hub.gated(REPO, set())
    hub.valid_tokens.add("hf_other")
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(AccessDeniedError, match="gated"):
        await load_model(f"hf://{REPO}")
    # 404: the branch the cache holds is gone from the Hub.
    hub.gated(REPO, {"hf_other"})
    hub.untag(REPO, "main")
    with pytest.raises(NotFoundError, match="no revision 'main'"):
        await load_model(f"hf://{REPO}")
    # (401, a private repository without a token: test_hf_tree.py)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (-1, "-1"), (float("nan"), "nan"), (float("inf"), "inf"), (True, "soon"),
     ("10", "")],
)  # fmt: skip
def test_a_bad_revision_timeout_is_refused(value: object, text: str) -> None:
    with pytest.raises(ConfigError, match="hf_revision_timeout"):
        LoadOptions.build(environ={}, hf_revision_timeout=value)
    with pytest.raises(ConfigError, match=r"HF_REVISION_TIMEOUT|hf_revision_timeout"):
        LoadOptions.build(environ={"AIOLOADER_HF_REVISION_TIMEOUT": text})
