"""No client can forge a line of the daemon's log: a URL holding a control character is
refused (400), and whatever text of others a message carries has its control characters
escaped."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest

from .daemon_helpers import running
from .servers import FaultyHttpServer

pytest.importorskip("prometheus_client")

FORGED = "INFO aioloader.daemon.downloads: https://trusted/model.safetensors (x) is cached"


TAILS = [
    "\n" + FORGED,
    "\r\n" + FORGED,
    "\u2028" + FORGED,
    "\x1b[2J\x1b[H" + FORGED,
    "\x85" + FORGED,
    "\u202e" + "sretsnesafe",  # right-to-left override
    " " + FORGED,
    "\t" + FORGED,
]


def test_a_url_with_a_control_character_is_refused(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    with running(tmp_path / "cache") as daemon:
        for tail in TAILS:
            url = http_server.url_for("m.safetensors") + tail
            status, body = daemon.post({"url": url})
            assert (status, body["error"]) == (400, "bad_url"), (tail, body)
            assert "percent-encode it" in body["detail"]
        # Encoded, the same characters are a URL like any other.
        encoded = http_server.url_for("m.safetensors") + "?note=%0A%1B"
        assert daemon.post({"url": encoded, "id": "encoded"})[0] == 202
        assert [m["id"] for m in daemon.get("/v1/models")[1]["models"]] == ["encoded"]
        assert daemon.stop() == 0
    assert "trusted" not in daemon.output()  # no line of the client's reached the log


def test_log_messages_escape_control_characters() -> None:
    from aioloader.daemon.logs import EscapingFilter, escape_controls

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(EscapingFilter())
    log = logging.getLogger("aioloader.test.escaping")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("%s failed: %s", "https://h/m", "denied\n" + FORGED + "\x1b[31m")
        log.warning("plain message")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines == [
        "https://h/m failed: denied\\n" + FORGED + "\\x1b[31m",
        "plain message",
    ]
    assert escape_controls("a\u2028b\x00c\x7fd\té") == "a\\u2028b\\x00c\\x7fd\\té"


def test_the_daemons_lines_start_with_the_time_in_utc(tmp_path: Path) -> None:
    """Nodes' logs are lined up by the time: each line of ``aioloader serve`` starts with
    it (UTC, to the millisecond); the other commands' lines do not."""
    import calendar
    import time

    before = time.time()
    with running(tmp_path / "cache") as daemon:
        assert daemon.stop() == 0
    lines = [line for line in daemon.output().splitlines() if " aioloader." in line]
    assert lines, daemon.output()
    for line in lines:
        found = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{3}Z (INFO|WARNING) ", line)
        assert found, line
        stamp = calendar.timegm(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S"))
        assert before - 2 <= stamp <= time.time() + 1, line


def test_the_other_commands_lines_carry_no_time(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", str(tmp_path / "missing.safetensors")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert not re.match(r"\d{4}-", done.stderr), done.stderr
