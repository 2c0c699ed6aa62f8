"""The server of the remote scenarios: an nginx of its own, over HTTP and as S3."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .config import NGINX_START_TIMEOUT, NGINX_WORKERS, S3_BUCKET, S3_ENV, S3_ENV_DROPPED
from .data import Dataset
from .machine import read_text
from .scenarios import kind_of


def nginx_binary() -> str | None:
    """nginx on PATH, or in /usr/sbin (which is not on every user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")


def free_port() -> int:
    """A loopback port nothing listens on now (another program could take it before nginx)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def nginx_config(root: Path, port: int, scratch: Path) -> str:
    """An nginx of its own: serves ``root`` on ``port`` as is and under /bench/ (the S3 bucket).

    Every file it writes goes to ``scratch``; it stays in the foreground so that
    it is a child of this process and is stopped with it. Run as root, its
    workers run as root too, or they could not read a data folder only root
    may enter. sendfile: the data go from the page cache to the socket without
    a copy in user space, which keeps the server's share of the 2 CPUs small.
    """
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "".join(
        f'    {name}_temp_path "{scratch / name}";\n'
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""\
{user}daemon off;
worker_processes {NGINX_WORKERS};
pid "{scratch / "nginx.pid"}";
error_log "{scratch / "error.log"}" warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    default_type application/octet-stream;
{temp}    server {{
        listen 127.0.0.1:{port};
        root "{root}";
        location /{S3_BUCKET}/ {{ alias "{root}/"; }}
    }}
}}
"""


@contextmanager
def nginx_server(root: Path) -> Iterator[str]:
    """Serve ``root`` with nginx while the block runs; yields ``http://127.0.0.1:PORT``.

    nginx is stopped when the block ends, however it ends (an error, Ctrl-C,
    SIGTERM, which ``bench`` turns into an exception).
    """
    nginx = nginx_binary()
    if nginx is None:
        raise RuntimeError("nginx is not installed")
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as scratch:
        port = free_port()
        config = Path(scratch) / "nginx.conf"
        config.write_text(nginx_config(root.resolve(), port, Path(scratch)))
        command = [nginx, "-p", scratch, "-c", str(config)]
        # Its own session: Ctrl-C reaches this process, which stops nginx itself.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_listening(process, port, Path(scratch) / "error.log")
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(process)


def wait_listening(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Return once ``port`` accepts connections; raise with nginx's log if it exits or is slow."""
    deadline = time.monotonic() + NGINX_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    message = read_text(str(log)) or "(no log)"
    raise RuntimeError(f"nginx did not start (exit {process.poll()}): {message}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (nginx's fast shutdown) to its process group, then SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def s3_env(env: dict[str, str], endpoint: str) -> dict[str, str]:
    """The workers' environment for the S3 scenarios (see ``S3_ENV``)."""
    env = {k: v for k, v in env.items() if k not in S3_ENV_DROPPED}
    return {**env, **S3_ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}


def remote_env(env: dict[str, str]) -> dict[str, str]:
    """No proxy between the clients and nginx, whatever the environment says."""
    return {**env, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def scenario_url(scenario: str, dataset: Dataset, out: Path, endpoint: str) -> str:
    """Where nginx serves ``dataset`` for ``scenario``: an http:// or s3:// URL."""
    path = dataset.target.resolve().relative_to(out.resolve()).as_posix()
    if kind_of(scenario) == "s3":
        return f"s3://{S3_BUCKET}/{path}"
    return f"{endpoint}/{path}"
