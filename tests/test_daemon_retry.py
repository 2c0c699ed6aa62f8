"""A failed model is tried again until it is cached: /ready goes 503 -> 200 without a restart.

The real ``aioloader serve`` against the fault-injecting HTTP server, with small
backoff delays (``--retry-backoff``) so the tries come quickly. The upstream
fails by answering 404 (a store or CDN that does not have the object yet), which
the HTTP source does not retry itself: each failure is one preload try.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from aioloader import ConfigError
from aioloader.daemon.retry import Backoff

from .daemon_helpers import running, single_file, write_model
from .helpers import assert_matches_files
from .servers import FaultyHttpServer

pytest.importorskip("prometheus_client")

FAST = ("--retry-backoff", "0.05", "--retry-backoff-max", "0.2")


def test_a_failed_preload_is_retried_until_ready(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    _, shards = write_model(http_server.root / "llama", shards=2, kib=200)
    name = "llama/model.safetensors.index.json"
    url = http_server.url_for(name)
    http_server.status(name, 404, count=1_000_000)  # down until cleared
    with running(tmp_path / "cache", "--model", url, *FAST) as daemon:
        # Several failed tries, and the daemon keeps serving through them.
        model_id = daemon.get("/ready")[1]["missing"][0]["id"]
        daemon.wait_for(lambda: daemon.model(model_id)["failures"] >= 3, 20, "three failures")
        status, body = daemon.get("/ready")
        assert status == 503 and body["ready"] is False
        [missing] = body["missing"]
        assert missing["id"] == model_id and missing["error_kind"] == "NotFoundError"
        assert name in missing["error"] and missing["failures"] >= 3
        if missing["status"] == "failed":  # between two tries: when is the next one
            assert missing["next_try"] is not None and 0 <= missing["next_try_in"] <= 0.2
            assert "next try in" in missing["reason"]
        else:  # caught during a try: the last failure is still named
            assert missing["status"] in ("queued", "downloading")
            assert "the last failed" in missing["reason"]
        assert daemon.get("/health") == (200, {"status": "ok"})  # the process is fine

        http_server.clear_faults()  # the upstream is back
        daemon.wait_ready()
        record = daemon.model(model_id)
        assert record["status"] == "ready" and record["error"] is None
        assert record["failures"] == 0 and record["next_try"] is None
        links = sorted(Path(record["path"]).parent.glob("*.safetensors"))
        got = {k: v for f in links for k, v in load_file(str(f)).items()}
        assert_matches_files(got, *shards)
        assert daemon.metrics()["aioloader_daemon_errors_total{kind=NotFoundError}"] >= 3
        assert daemon.stop() == 0
    assert "next try in" in daemon.output()


def test_deleting_a_failing_preload_stops_its_retries(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    single_file(http_server.root / "m.safetensors", kib=64)
    http_server.status("m.safetensors", 403, count=1_000_000)
    url = http_server.url_for("m.safetensors")
    with running(tmp_path / "cache", "--model", url, *FAST) as daemon:
        model_id = daemon.get("/ready")[1]["missing"][0]["id"]
        daemon.wait_for(lambda: daemon.model(model_id)["failures"] >= 2, 20, "two failures")
        assert daemon.request("DELETE", f"/v1/models/{model_id}")[0] == 200
        assert daemon.get("/ready")[0] == 200  # nothing left to wait for
        tried = len(http_server.gets("m.safetensors"))
        # Twenty times the longest delay: a retry loop still running would have asked.
        time.sleep(4.0)
        assert len(http_server.gets("m.safetensors")) == tried
        assert daemon.get(f"/v1/models/{model_id}")[0] == 404
        assert daemon.stop() == 0


def test_posting_a_failed_preload_tries_it_now(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    src = single_file(http_server.root / "m.safetensors", kib=64)
    http_server.status("m.safetensors", 404, count=1)
    url = http_server.url_for("m.safetensors")
    # The next try would be ten minutes away; a POST of the URL need not wait for it.
    slow = ("--retry-backoff", "600", "--retry-backoff-max", "600")
    with running(tmp_path / "cache", "--model", url, *slow) as daemon:
        model_id = daemon.get("/ready")[1]["missing"][0]["id"]
        failed = daemon.wait_status(model_id, "failed")
        assert failed["failures"] == 1 and failed["next_try_in"] >= 300
        assert daemon.post({"url": url})[0] == 202
        daemon.wait_ready()
        record = daemon.model(model_id)
        assert record["bytes_total"] == src.stat().st_size
        assert daemon.stop(seconds=15) == 0  # no retry left behind to wait for


def test_a_posted_model_is_retried_until_ready(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """A model added through the API is retried like a preload: an upstream blip does
    not leave it failed until a client posts it again."""
    src = single_file(http_server.root / "m.safetensors", kib=64)
    http_server.status("m.safetensors", 404, count=3)  # three tries fail, then it is there
    with running(tmp_path / "cache", *FAST) as daemon:
        body = {"url": http_server.url_for("m.safetensors"), "id": "posted"}
        assert daemon.post(body)[0] == 202
        record = daemon.wait_status("posted", "ready")
        assert record["failures"] == 0 and record["error"] is None
        assert record["bytes_total"] == src.stat().st_size
        assert Path(record["path"]).read_bytes() == src.read_bytes()
        assert daemon.metrics()["aioloader_daemon_errors_total{kind=NotFoundError}"] == 3
        assert daemon.stop() == 0
    assert len(http_server.gets("m.safetensors")) >= 4


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.delay(n, lambda: 1.0) for n in (1, 2, 3, 4, 50, 10**6)] == [
        0.5, 1.0, 2.0, 3.0, 3.0, 3.0,
    ]  # fmt: skip
    assert [backoff.delay(n, lambda: 0.0) for n in (0, 1, 2, 3)] == [0.25, 0.25, 0.5, 1.0]


@pytest.mark.parametrize(
    ("base", "cap"),
    [
        (float("nan"), 1.0), (1.0, float("nan")), (float("inf"), float("inf")), (0.0, 1.0),
        (-1.0, 1.0), (2.0, 1.0), (True, 2.0), ("1", 2.0), (1.0, 1e300),
    ],
)  # fmt: skip
def test_backoff_refuses_unusable_delays(base: object, cap: object) -> None:
    with pytest.raises(ConfigError, match="retry backoff"):
        Backoff(base, cap)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--retry-backoff", "nan"], {}, "retry backoff must be a finite number"),
        (["--retry-backoff", "0"], {}, "retry backoff must be positive"),
        (["--retry-backoff", "-3"], {}, "retry backoff must be positive"),
        (["--retry-backoff", "soon"], {}, "retry backoff must be a number"),
        (["--retry-backoff-max", "inf"], {}, "retry backoff max must be a finite number"),
        (["--retry-backoff", "10", "--retry-backoff-max", "1"], {}, "must not be below"),
        ([], {"AIOLOADER_RETRY_BACKOFF": "1e999"}, "retry backoff must be a finite number"),
        ([], {"AIOLOADER_RETRY_BACKOFF_MAX": "0.1"}, "must not be below"),
        (["--grace-period", "nan"], {}, "grace period must be a finite number"),
        (["--grace-period", "inf"], {}, "grace period must be a finite number"),
        (["--max-downloads", "0"], {}, "max downloads must be positive"),
    ],
)
def test_serve_refuses_unusable_numbers(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    out = subprocess.run(
        [sys.executable, "-m", "aioloader", "serve", "--cache-dir", str(tmp_path), *args],
        capture_output=True, text=True, timeout=30, check=False, env={**environ, **env},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_backoff_from_flags_and_environment(tmp_path: Path) -> None:
    import argparse

    from aioloader.daemon.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {"AIOLOADER_RETRY_BACKOFF": "0.5", "AIOLOADER_RETRY_BACKOFF_MAX": "30"}
    config = config_from_args(parser.parse_args([]), env)
    assert config.backoff == Backoff(0.5, 30.0)
    config = config_from_args(parser.parse_args(["--retry-backoff-max", "2"]), env)
    assert config.backoff == Backoff(0.5, 2.0)
    default = config_from_args(parser.parse_args([]), {"HOME": str(tmp_path)})
    assert default.backoff == Backoff()
    assert "retry_backoff=0.5" in repr(config)
