"""Run the real ``aioloader serve`` as a subprocess and talk to it over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .fleet import free_port
from .helpers import write_file

# Lets the daemon run under resource limits: a file size limit (a "full disk" for files
# above it; the wrapper ignores SIGXFSZ, which exec keeps, so a write past the limit fails
# with EFBIG) and an open-file limit (soft, hard). -1 leaves a limit as it is.
_LIMITED = (
    "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "n, soft, hard = (int(a) for a in sys.argv[1:4]); "
    "n < 0 or resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "soft < 0 or resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'aioloader', *sys.argv[4:]])"
)

TOKEN = "9f2c4e71b8a35d06c1e7f4a29b83d5e0"
"""A token the daemon accepts (32 hex digits, as `openssl rand -hex 16` makes)."""


def write_model(folder: Path, shards: int, kib: int, seed: int = 0) -> tuple[Path, list[Path]]:
    """An indexed model of ``shards`` files of about ``kib`` KiB each; (index, shard files)."""
    weight_map = {}
    files = []
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        gen = torch.Generator().manual_seed(seed * 100 + s)
        tensors = {f"layer.{s}.weight": torch.randn(kib * 256, generator=gen)}
        files.append(write_file(folder / name, tensors))
        weight_map.update(dict.fromkeys(tensors, name))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index, files


def single_file(path: Path, kib: int, seed: int = 0) -> Path:
    gen = torch.Generator().manual_seed(seed)
    return write_file(path, {"weight": torch.randn(kib * 256, generator=gen)})


class Daemon:
    """``python -m aioloader serve`` on a free port, its log in a file."""

    def __init__(
        self,
        cache_dir: Path,
        *args: str,
        token: str | None = None,
        fsize_limit: int | None = None,
        open_files: tuple[int, int] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.cache_dir = cache_dir
        self.args = list(args)
        self.token = token
        self.fsize_limit = fsize_limit
        self.open_files = open_files
        self.env = env
        self.port = free_port()
        self.log = cache_dir.parent / f"daemon-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        serve = ["serve", "--port", str(self.port), "--cache-dir", str(self.cache_dir)]
        if self.fsize_limit is not None or self.open_files is not None:
            soft, hard = self.open_files or (-1, -1)
            limits = [str(self.fsize_limit or -1), str(soft), str(hard)]
            return [sys.executable, "-c", _LIMITED, *limits, *serve, *self.args]
        return [sys.executable, "-m", "aioloader", *serve, *self.args]

    def start(self, wait: bool = True) -> Daemon:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
        env.update(self.env or {})
        env["PYTHONUNBUFFERED"] = "1"
        if self.token:
            env["AIOLOADER_TOKEN"] = self.token
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env)
        if wait:
            self.wait_for(lambda: self.get("/health")[0] == 200, 30, "/health")
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, check: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited ({self.proc.returncode}):\n{self.output()}")
            with contextlib.suppress(OSError):
                if check():
                    return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output()[-4000:]}")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        token: str | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text); ``token`` overrides the daemon's own."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        bearer = token if token is not None else self.token
        if bearer:
            request.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, text = response.status, response.read().decode()
                kind = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
            kind = exc.headers.get("Content-Type", "")
        return status, json.loads(text) if kind.startswith("application/json") else text

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def post(self, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.request("POST", "/v1/models", body, **kw)

    def model(self, key: str) -> dict[str, Any]:
        status, body = self.get(f"/v1/models/{key}")
        assert status == 200, (status, body)
        return body  # type: ignore[no-any-return]

    def wait_status(self, key: str, want: str, seconds: float = 20) -> dict[str, Any]:
        self.wait_for(lambda: self.model(key)["status"] == want, seconds, f"{key} {want}")
        return self.model(key)

    def wait_ready(self, seconds: float = 20) -> None:
        self.wait_for(lambda: self.get("/ready")[0] == 200, seconds, "/ready")

    def metrics(self) -> dict[str, float]:
        """Samples as {"name{label=value,...}": value}."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.get("/metrics")
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def stop(self, sig: int = signal.SIGTERM, seconds: float = 15) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon ignored signal {sig}:\n{self.output()}") from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def running(cache_dir: Path, *args: str, **kw: Any) -> Iterator[Daemon]:
    """A started daemon, killed on the way out if still running."""
    daemon = Daemon(cache_dir, *args, **kw)
    try:
        yield daemon.start()
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()


def fake_entries(cache_dir: Path, count: int, size: int = 16) -> list[str]:
    """``count`` complete entries of made-up URLs, written in the cache's own format
    (its ``EntryFiles`` and ``Meta``) without a download; returns their URLs."""
    from dataclasses import asdict

    from aioloader.cache.entry import EntryFiles, Meta

    now = time.time()
    urls = []
    for i in range(count):
        url = f"https://models.invalid/fake-{i}/model.safetensors"
        files = EntryFiles.of(cache_dir, url)
        files.make()
        files.data.write_bytes(bytes(size))
        meta = Meta(
            url=url, size=size, etag=f'"etag-{i}"', last_modified=None, complete=True,
            created=now, last_used=now - count + i,
        )  # fmt: skip
        files.meta.write_text(json.dumps(asdict(meta), sort_keys=True))
        urls.append(url)
    return urls


def read_syscalls(pid: int) -> int | None:
    """How many read-like system calls process ``pid`` made so far (None: not on Linux)."""
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return None
    fields = dict(line.split(": ") for line in text.splitlines())
    return int(fields["syscr"])


def final_files(cache_dir: Path) -> Sequence[Path]:
    """Every cache file under a final name (entry data and the model links)."""
    entries = sorted(cache_dir.glob("entries/*/data"))
    links = sorted(p for p in cache_dir.glob("models/**/*") if p.is_symlink() or p.is_file())
    return entries + links
