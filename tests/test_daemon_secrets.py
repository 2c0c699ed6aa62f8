"""The daemon shows no secret of a presigned or user-info URL: not in /ready,
/v1/models, /metrics, nor in its log."""

from __future__ import annotations

from pathlib import Path

import pytest

from .daemon_helpers import running, single_file
from .servers import FaultyHttpServer

pytest.importorskip("prometheus_client")

SIGNED = (
    "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIASECRET%2F20240101%2Fus-east-1"
    "&X-Amz-Expires=3600&X-Amz-Security-Token=SECRETTOKEN&X-Amz-Signature=SECRETSIG"
)


def test_no_surface_shows_a_secret(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    single_file(http_server.root / "ok.safetensors", kib=64)
    gone = http_server.url_for("gone.safetensors") + SIGNED
    ok = http_server.url_for("ok.safetensors") + SIGNED
    with_user = http_server.url.replace("://", "://user:PASSWORDSECRET@") + "/gone2.safetensors"
    with running(tmp_path / "cache", "--model", ok) as daemon:
        for url, model_id in ((gone, "gone"), (with_user, "gone2")):
            assert daemon.post({"url": url, "id": model_id})[0] == 202
            record = daemon.wait_status(model_id, "failed", seconds=10)
            assert record["error_kind"] == "NotFoundError", record
        daemon.wait_status(daemon.get("/v1/models")[1]["models"][0]["id"], "ready")

        status, ready = daemon.get("/ready")
        assert status == 200 and len(ready["pending"]) == 2  # the preload is ready
        by_id = {m["id"]: m for m in ready["pending"]}
        assert "X-Amz-Signature=REDACTED" in by_id["gone"]["error"]
        assert "X-Amz-Signature=REDACTED" in by_id["gone"]["url"]
        assert "://REDACTED@" in by_id["gone2"]["error"]
        _, models = daemon.get("/v1/models")
        _, one = daemon.get("/v1/models/gone")
        _, text = daemon.get("/metrics")
        assert daemon.stop() == 0
    for surface in (str(ready), str(models), str(one), text, daemon.output()):
        assert "SECRET" not in surface, surface
