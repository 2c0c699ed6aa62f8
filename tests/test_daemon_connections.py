"""Clients that connect and send nothing, or a header a byte at a time, cannot starve the
probes: the daemon caps its connections (closing the longest idle one to make room),
closes those that do not deliver a request within ``--client-timeout``, and lifts its
open-file limit at startup.

The real ``aioloader serve`` under a small open-file limit (so that a few hundred
sockets are enough), and raw sockets from the test.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from pathlib import Path

import pytest

from .daemon_helpers import running

pytest.importorskip("prometheus_client")

OPEN_FILES = 256  # the daemon's open-file limit: its cap becomes half of it
SLOW = 300  # more slow clients than the daemon has descriptors
TIMEOUT = {"AIOLOADER_CLIENT_TIMEOUT": "1"}


def _slow_client(port: int) -> socket.socket:
    """A connection that sends part of a request's headers and then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    with contextlib.suppress(OSError):  # closed already: the daemon made room
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (call once it is readable)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionError:
        return True


def _wait_all_closed(socks: list[socket.socket], seconds: float) -> list[socket.socket]:
    """Wait up to ``seconds`` for the daemon to close every socket; returns those open."""
    waiting = set(socks)
    deadline = time.monotonic() + seconds
    while waiting and time.monotonic() < deadline:
        readable, _, _ = select.select(list(waiting), [], [], 0.5)
        waiting -= {s for s in readable if _closed(s)}
    return list(waiting)


def test_slow_clients_never_starve_the_probes(tmp_path: Path) -> None:
    with running(tmp_path / "cache", open_files=(OPEN_FILES, OPEN_FILES), env=TIMEOUT) as daemon:
        socks = [_slow_client(daemon.port) for _ in range(SLOW)]
        try:
            # Every descriptor the cap allows is taken by a slow client: the probe gets in
            # all the same, in the place of the longest idle one.
            assert daemon.get("/health") == (200, {"status": "ok"})
            assert daemon.get("/ready")[0] == 200
            # And each slow client is closed: made room for, or at its deadline.
            still_open = _wait_all_closed(socks, 30)
            assert not still_open, f"{len(still_open)} slow clients still connected"
        finally:
            for sock in socks:
                sock.close()
        assert daemon.get("/health")[0] == 200
        assert daemon.stop() == 0
    assert f"max connections lowered from 1000 to {OPEN_FILES // 2}" in daemon.output()


def test_a_body_that_does_not_arrive_is_answered_408(tmp_path: Path) -> None:
    with running(tmp_path / "cache", env=TIMEOUT) as daemon:
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=20) as sock:
            head = (
                b"POST /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            )
            sock.sendall(head + b'{"url": ')  # and the rest never comes
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(4096)
                assert chunk, f"closed without an answer: {answer!r}"
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert daemon.get("/health")[0] == 200
        assert daemon.stop() == 0


def test_the_open_file_limit_is_lifted_to_the_hard_limit(tmp_path: Path) -> None:
    with running(tmp_path / "cache", open_files=(200, 4096)) as daemon:
        assert daemon.proc is not None
        limits = Path(f"/proc/{daemon.proc.pid}/limits")
        if not limits.exists():
            pytest.skip("needs /proc/<pid>/limits")
        line = next(x for x in limits.read_text().splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
        assert daemon.stop() == 0
    assert "open-file limit raised from 200 to 4096" in daemon.output()
