"""A fleet of real ``aioloader serve`` daemons and an origin, for tests and the benchmark.

``Fleet(n, root)`` runs node ``i`` as its own ``python -m aioloader serve`` on
127.0.0.(10+i) (``host_of`` changes that, ``wrap`` prefixes its command: ``ip netns
exec <ns>`` in the benchmark), with its own API port, swarm port and cache folder and
one shared token. With ``swarm=True`` each node gets ``--peers`` naming the API of
every listed node and ``--swarm-port``; without, every node pulls from the origin as
the daemon does today. ``Origin`` (fleet_origin.py) serves the model and counts the
body bytes it sends. ``write_model`` writes real safetensors shards and their index.

Every daemon is started with a parent-death signal (SIGKILL) and ``Fleet.close()``
kills what still runs, so that no test, failed or not, leaves a daemon behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from .fleet_model import Model, digest, write_model
from .fleet_origin import Origin

__all__ = [
    "TOKEN",
    "Fleet",
    "Model",
    "Node",
    "Origin",
    "daemon_flag",
    "swarm_missing",
    "write_model",
]

TOKEN = "5e0c2b9d71a4f8e36b1d0c9a7e52f4b8"
"""The token every node of a fleet shares (32 hex digits)."""

REPO = Path(__file__).resolve().parent.parent


def daemon_flag(name: str) -> bool:
    """Whether ``aioloader serve`` has the setting ``name`` (a row of settings.DAEMON)."""
    from aioloader.settings.table import DAEMON

    return any(row.name == name for row in DAEMON)


def swarm_missing() -> str | None:
    """Why the daemons cannot share models here, or None when they can."""
    if importlib.util.find_spec("aioloader.swarm") is None:
        return "aioloader.swarm is not part of this tree yet"
    if not (daemon_flag("peers") and daemon_flag("swarm_port")):
        return "aioloader serve has no --peers / --swarm-port"
    if importlib.util.find_spec("libtorrent") is None:
        return "libtorrent is not installed (pip install aioloader[swarm])"
    return None


# -- nodes ------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now: ask on the address the daemon will bind. One free on
    127.0.0.1 may be taken on 127.0.0.171 by a daemon of a test on the other worker
    (its outgoing connections leave from its own address): "address already in use"."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# The nodes are reached directly, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Node:
    """One daemon of a fleet; ``listed``: named in the other nodes' ``--peers``."""

    index: int
    host: str
    port: int
    swarm_port: int
    cache_dir: Path
    log: Path
    token: str | None = TOKEN
    listed: bool = True
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None,
        timeout: float = 10,
    ) -> tuple[int, Any]:  # fmt: skip
        """(status, parsed JSON or text); ``token``: "" sends none, None the node's own."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        bearer = self.token if token is None else token
        if bearer:
            request.add_header("Authorization", f"Bearer {bearer}")
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                status, raw, kind = response.status, response.read(), response.headers
        except urllib.error.HTTPError as exc:
            status, raw, kind = exc.code, exc.read(), exc.headers
        text = raw.decode(errors="replace")
        is_json = (kind.get("Content-Type") or "").startswith("application/json")
        return status, json.loads(text) if is_json else text

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def model(self, model_id: str) -> dict[str, Any]:
        status, body = self.get(f"/v1/models/{model_id}")
        assert status == 200, f"node {self.index}: GET /v1/models/{model_id}: {status} {body}"
        return body  # type: ignore[no-any-return]

    def metrics(self) -> str:
        status, text = self.get("/metrics")
        assert status == 200, f"node {self.index}: /metrics answered {status}"
        return str(text)

    def sample(self, name: str, **labels: str) -> float:
        """The sum of the /metrics samples called ``name`` that carry ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for family in text_string_to_metric_families(self.metrics()):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def entry(self, url: str) -> Path:
        """Where this node's cache keeps the committed bytes of ``url``."""
        from aioloader.cache.entry import EntryFiles

        return EntryFiles.of(self.cache_dir, url).data


class Fleet:
    """``n`` daemons sharing one token; see the module docstring."""

    def __init__(
        self,
        n: int,
        root: Path,
        *,
        swarm: bool = False,
        args: Sequence[str] = (),
        token: str = TOKEN,
        host_of: Callable[[int], str] | None = None,
        wrap: Callable[[int], list[str]] | None = None,
        env: dict[str, str] | None = None,
        ports: Callable[[int], tuple[int, int]] | None = None,
    ) -> None:
        self.root = Path(root)
        self.swarm = swarm
        self.args = list(args)
        self.token = token
        self.host_of = host_of or (lambda i: f"127.0.0.{10 + i}")
        self.wrap = wrap or (lambda i: [])
        self.env = env or {}
        self.ports = ports
        self.nodes: list[Node] = []
        for _ in range(n):
            self.add()

    def __repr__(self) -> str:
        alive = [n.index for n in self.nodes if n.alive]
        return f"<Fleet {len(self.nodes)} nodes, swarm={self.swarm}, alive={alive}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def __len__(self) -> int:
        return len(self.nodes)

    def add(self, *, listed: bool = True, token: str | None = None) -> Node:
        """A node more (not started); ``listed=False``: left out of everyone's --peers."""
        i = len(self.nodes)
        host = self.host_of(i)
        cache = self.root / f"node{i}" / "cache"
        cache.parent.mkdir(parents=True, exist_ok=True)
        if self.ports is not None:
            port, swarm_port = self.ports(i)
        else:
            bind = host if host.startswith("127.") else "127.0.0.1"
            port, swarm_port = free_port(bind), free_port(bind)
        node = Node(
            i, host, port, swarm_port, cache, cache.parent / "daemon.log",
            token=self.token if token is None else token, listed=listed,
        )  # fmt: skip
        self.nodes.append(node)
        return node

    def peers(self) -> str:
        return ",".join(n.address for n in self.nodes if n.listed)

    def command(self, node: Node) -> list[str]:
        cmd = [
            sys.executable, "-m", "aioloader", "serve", "--host", node.host,
            "--port", str(node.port), "--cache-dir", str(node.cache_dir), *self.args,
        ]  # fmt: skip
        if self.swarm:
            cmd += ["--peers", self.peers(), "--swarm-port", str(node.swarm_port)]
        return [*self.wrap(node.index), *cmd]

    def start(self, *which: int, wait: bool = True) -> None:
        """Start nodes ``which`` (all when none given) and wait for their /health."""
        chosen = [self.nodes[i] for i in which] if which else self.nodes
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        for node in chosen:
            assert not node.alive, f"node {node.index} is running already"
            node_env = dict(env)
            if node.token:
                node_env["AIOLOADER_TOKEN"] = node.token
            with node.log.open("ab") as log:
                node.proc = subprocess.Popen(
                    self.command(node), stdout=log, stderr=log, env=node_env,
                    preexec_fn=_die_with_parent, cwd=self.root,
                )  # fmt: skip
        if wait:
            for node in chosen:
                self.wait_for(node, lambda n: n.get("/health", timeout=2)[0] == 200, 60, "/health")

    def stop(self, i: int, seconds: float = 30) -> int:
        """SIGTERM node ``i`` and wait for its exit status."""
        proc = self.nodes[i].proc
        assert proc is not None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"node {i} ignored SIGTERM:\n{self.nodes[i].output()[-3000:]}"
            ) from None

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``: no shutdown, as a machine that died."""
        proc = self.nodes[i].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def wipe(self, i: int) -> None:
        """Empty node ``i``'s cache (the node must be down)."""
        assert not self.nodes[i].alive
        shutil.rmtree(self.nodes[i].cache_dir, ignore_errors=True)

    def close(self) -> None:
        """Kill every node still running (a test that fails leaves none behind)."""
        for node in self.nodes:
            self.kill(node.index)

    # -- models -----------------------------------------------------------------------

    def post(self, i: int, url: str, model_id: str) -> dict[str, Any]:
        status, body = self.nodes[i].request("POST", "/v1/models", {"url": url, "id": model_id})
        assert status in (200, 202), f"node {i}: POST /v1/models: {status} {body}"
        return body  # type: ignore[no-any-return]

    def wait_for(
        self, node: Node, check: Callable[[Node], bool], seconds: float, what: str
    ) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if node.proc is not None and node.proc.poll() is not None:
                raise AssertionError(
                    f"node {node.index} exited ({node.proc.returncode}) while waiting for "
                    f"{what}:\n{node.output()[-4000:]}"
                )
            with contextlib.suppress(OSError):
                if check(node):
                    return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"node {node.index}: no {what} within {seconds:g} s:\n{node.output()[-4000:]}"
                )
            time.sleep(0.05)

    def wait_ready(self, i: int, model_id: str, seconds: float = 60) -> dict[str, Any]:
        """Wait until node ``i`` holds ``model_id`` (status ready); its record. A model
        that fails says why at once."""

        def ready(node: Node) -> bool:
            record = node.model(model_id)
            if record["status"] == "failed":
                raise AssertionError(f"node {i}: {model_id} failed: {record['error']}")
            return bool(record["status"] == "ready")

        self.wait_for(self.nodes[i], ready, seconds, f"{model_id} ready")
        return self.nodes[i].model(model_id)

    def wait_all(
        self, model_id: str, which: Iterable[int] | None = None, seconds: float = 60
    ) -> dict[int, dict[str, Any]]:
        """``wait_ready`` on every node of ``which`` (default: those alive)."""
        chosen = list(which) if which is not None else [n.index for n in self.nodes if n.alive]
        deadline = time.monotonic() + seconds
        return {
            i: self.wait_ready(i, model_id, max(1.0, deadline - time.monotonic())) for i in chosen
        }

    def mismatches(self, i: int, model: Model, origin: Origin, tensors: bool = True) -> list[str]:
        """The files of ``model`` whose bytes in node ``i``'s cache differ from the origin's
        (empty: bit-identical); with ``tensors`` each shard is also read back with
        ``safetensors``."""
        from safetensors.numpy import load_file

        wrong = []
        for path in model.files:
            rel = model.relpath(path, origin.root)
            entry = self.nodes[i].entry(origin.url_for(rel))
            if not entry.is_file():
                wrong.append(f"{rel}: not in node {i}'s cache ({entry})")
            elif digest(entry) != digest(path):
                wrong.append(f"{rel}: node {i}'s copy differs from the origin's")
            elif tensors and path.suffix == ".safetensors":
                ours, theirs = load_file(str(entry)), load_file(str(path))
                if ours.keys() != theirs.keys() or any(
                    ours[k].tobytes() != theirs[k].tobytes() for k in ours
                ):
                    wrong.append(f"{rel}: node {i}'s tensors differ")
        return wrong
