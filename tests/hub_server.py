"""A local Hugging Face Hub for tests: ``LocalHub``.

It speaks the parts of the Hub's API that ``huggingface_hub`` and aioloader use:
a revision's info (``/api/models/{repo}/revision/{rev}``: its commit ``sha`` and
``siblings``), the tree listing (``/api/models/{repo}/tree/{rev}``, files with their
LFS ``oid`` = sha256 and size) and ``/{repo}/resolve/{rev}/{path}`` for GET and HEAD
with ``X-Repo-Commit``, ``ETag`` and, for LFS files, ``X-Linked-Etag`` and
``X-Linked-Size`` and a 302 to a second server on another port, the "storage" host
(a ``FaultyHttpServer`` over the blobs, named by sha256: Range, 5xx, cut bodies).
Errors carry the Hub's ``X-Error-Code`` / ``X-Error-Message`` headers, as the Hub
sends them: anonymous requests for a private or missing repository get 401.

Fault modes: a token required (``private``), ``gated``, ``move_after_first`` (a
branch moves to another commit after its first revision request), a path that is
answered late (``delays``), never (``hang``: the request is read and logged, and
no answer comes) or with a status (``statuses``), and the storage server's own
faults (``hub.storage.status(...)``, ``short_body(...)``).
Every request is recorded with its headers (``hub.log``; the storage host has
its own ``request_headers``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import unquote

from aiohttp import web

from .http_server import FaultyHttpServer, _parse_range
from .lifetime import StartStop

__all__ = ["HubRequest", "LocalHub"]

_INVALID = "Invalid credentials in Authorization header"


@dataclass(frozen=True)
class HubRequest:
    """One request to the Hub's host: method, raw path and headers."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class _Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    private_tokens: set[str] | None = None  # None: public
    gated_tokens: set[str] | None = None  # None: not gated; else who accepted the licence
    moves: dict[str, str] = field(default_factory=dict)  # branch -> sha after first request


def _is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


# Digests of a file's bytes, computed once per bytes object: the Hub publishes them
# with every listing and download (precomputed there), and hashing a GiB on every
# request would make this Hub, not the client, what a benchmark measures.
@functools.cache
def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@functools.cache
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalHub(StartStop):
    """A Hub on 127.0.0.1 with a storage host beside it; ``with LocalHub(tmp) as hub:``.

    Args:
        root: a folder for the storage host's blobs.
    """

    def __init__(self, root: Path) -> None:
        blobs = Path(root) / "hub-storage"
        blobs.mkdir(parents=True, exist_ok=True)
        self.storage = FaultyHttpServer(blobs)
        self._blobs = blobs
        self.valid_tokens: set[str] = set()
        self.api_delay = 0.0  # seconds before each API answer (a slow or distant Hub)
        self.delays: dict[str, float] = {}  # path fragment -> seconds before its answer
        self.hang: set[str] = set()  # path fragments read and logged, never answered
        self.statuses: dict[str, int] = {}  # path fragment -> the status it is answered
        self.lying_sha: Any = None  # set: the revision's "sha" in every answer
        self._repos: dict[str, _Repo] = {}
        self._log: list[HubRequest] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._stopping = asyncio.Event()  # set when the server stops (made anew in _serve)
        self._port = 0

    # -- content ----------------------------------------------------------------------

    def commit(self, repo: str, files: dict[str, bytes], *, branch: str = "main") -> str:
        """Add a commit holding ``files`` (path -> bytes), point ``branch`` at it and
        return its sha. ``*.safetensors`` files are LFS: served by the storage host."""
        digest = hashlib.sha1(repo.encode())
        for path in sorted(files):
            # Both digests now, as the Hub has them before anyone asks (and the first
            # request of a benchmark does not pay for them).
            _git_oid(files[path])
            digest.update(path.encode() + b"\0" + _sha256(files[path]).encode())
        sha = digest.hexdigest()
        for path, data in files.items():
            if _is_lfs(path):
                (self._blobs / _sha256(data)).write_bytes(data)
        with self._lock:
            entry = self._repos.setdefault(repo, _Repo())
            entry.commits[sha] = dict(files)
            entry.refs[branch] = sha
        return sha

    def tag(self, repo: str, name: str, sha: str) -> None:
        """Point the ref ``name`` (a tag, a branch) at ``sha``."""
        with self._lock:
            self._repos[repo].refs[name] = sha

    def untag(self, repo: str, name: str) -> None:
        """Delete the ref ``name`` (a branch or tag) of ``repo``."""
        with self._lock:
            del self._repos[repo].refs[name]

    def private(self, repo: str, tokens: set[str]) -> None:
        """Only requests with one of ``tokens`` may see ``repo`` (they become valid)."""
        with self._lock:
            self._repos[repo].private_tokens = set(tokens)
            self.valid_tokens |= tokens

    def gated(self, repo: str, accepted: set[str]) -> None:
        """``repo`` is gated: only tokens in ``accepted`` accepted its licence."""
        with self._lock:
            self._repos[repo].gated_tokens = set(accepted)

    def move_after_first(self, repo: str, branch: str, sha: str) -> None:
        """After the next revision request for ``branch``, it points to ``sha``."""
        with self._lock:
            self._repos[repo].moves[branch] = sha

    @property
    def log(self) -> list[HubRequest]:
        """Every request to the Hub's host so far (a copy)."""
        with self._lock:
            return list(self._log)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Start the storage host, then the Hub's thread, and wait until it listens."""
        self.storage.start()
        ready = threading.Event()

        def main() -> None:
            loop = self._loop = asyncio.new_event_loop()
            loop.run_until_complete(self._serve())
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=main, name="local-hub", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stop the Hub and the storage host."""
        loop, runner, thread = self._loop, self._runner, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(self._stopping.set)  # the hung requests end
            if runner is not None:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        self._loop = self._runner = self._thread = None
        self.storage.stop()

    @property
    def url(self) -> str:
        """The endpoint, for HF_ENDPOINT."""
        return f"http://127.0.0.1:{self._port}"

    # -- the API ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = request.raw_path.split("?", 1)[0]
        if self.api_delay and raw.startswith("/api/"):
            await asyncio.sleep(self.api_delay)
        for part, seconds in list(self.delays.items()):
            if part in raw:
                await asyncio.sleep(seconds)
        with self._lock:
            self._log.append(HubRequest(request.method, request.raw_path, dict(request.headers)))
        if any(part in raw for part in list(self.hang)):
            await self._stopping.wait()  # no answer, until the server stops
            return _error(503, "", "the local Hub is stopping")
        for part, status in list(self.statuses.items()):
            if part in raw:
                return _error(status, "", f"HTTP {status} from the local Hub")
        with self._lock:
            return self._answer(request, raw.lstrip("/").split("/"))

    def _answer(self, request: web.Request, parts: list[str]) -> web.StreamResponse:
        if parts[0] == "api" and len(parts) >= 4 and parts[1] == "models":
            repo, rest = "/".join(parts[2:4]), parts[4:]
            refused = self._refuse(request, repo)
            if refused is not None:
                return refused
            if not rest or rest[0] == "revision":
                return self._info(repo, unquote(rest[1]) if len(rest) > 1 else "main")
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(request, repo, unquote(rest[1]), unquote("/".join(rest[2:])))
        elif len(parts) >= 5 and parts[2] == "resolve" and request.method in ("GET", "HEAD"):
            repo = "/".join(parts[:2])
            refused = self._refuse(request, repo)
            if refused is not None:
                return refused
            return self._resolve(request, repo, unquote(parts[3]), unquote("/".join(parts[4:])))
        return _error(404, "", "Not Found")

    def _refuse(self, request: web.Request, repo: str) -> web.Response | None:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if token is not None and token not in self.valid_tokens:
            return _error(401, "", _INVALID)
        entry = self._repos.get(repo)
        hidden = entry is None or (
            entry.private_tokens is not None and token not in entry.private_tokens
        )
        if hidden:
            return _error(404 if token else 401, "RepoNotFound", "Repository not found")
        assert entry is not None
        if entry.gated_tokens is not None and token not in entry.gated_tokens:
            message = "Access to model is restricted; you must be authenticated"
            return _error(403 if token else 401, "GatedRepo", message)
        return None

    def _commit_of(self, repo: str, revision: str, *, asked: bool = False) -> str | None:
        entry = self._repos[repo]
        sha = entry.refs.get(revision) or (revision if revision in entry.commits else None)
        if asked and revision in entry.moves:
            entry.refs[revision] = entry.moves.pop(revision)
        return sha

    def _info(self, repo: str, revision: str) -> web.Response:
        sha = self._commit_of(repo, revision, asked=True)
        if sha is None:
            return _error(404, "RevisionNotFound", "Invalid rev id")
        files = self._repos[repo].commits[sha]
        identity = sha[:24]
        if self.lying_sha is not None:  # a Hub (or a proxy) that answers nonsense
            sha = self.lying_sha
        siblings = [{"rfilename": path} for path in sorted(files)]
        return web.json_response(
            {
                "_id": identity,
                "id": repo,
                "modelId": repo,
                "sha": sha,
                "private": False,
                "gated": False,
                "disabled": False,
                "siblings": siblings,
                "tags": [],
            }
        )

    def _tree(self, request: web.Request, repo: str, revision: str, folder: str) -> web.Response:
        sha = self._commit_of(repo, revision)
        if sha is None:
            return _error(404, "RevisionNotFound", "Invalid rev id")
        recursive = request.query.get("recursive", "").lower() in ("true", "1")
        prefix = folder + "/" if folder else ""
        entries: dict[str, dict[str, Any]] = {}
        for path, data in sorted(self._repos[repo].commits[sha].items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :].split("/")
            for depth in range(1, len(rest)):
                sub = prefix + "/".join(rest[:depth])
                if recursive or depth == 1:
                    entries.setdefault(sub, {"type": "directory", "oid": "0" * 40, "path": sub})
            if recursive or len(rest) == 1:
                entries[path] = _file_entry(path, data)
        if folder and not entries:
            return _error(404, "EntryNotFound", f"{folder} does not exist")
        return web.json_response(list(entries.values()))

    def _resolve(self, request: web.Request, repo: str, revision: str, path: str) -> web.Response:
        sha = self._commit_of(repo, revision)
        if sha is None:
            return _error(404, "RevisionNotFound", "Invalid rev id")
        data = self._repos[repo].commits[sha].get(path)
        if data is None:
            return _error(404, "EntryNotFound", f"{path} does not exist")
        headers = {"X-Repo-Commit": sha, "ETag": f'"{_git_oid(data)}"', "Accept-Ranges": "bytes"}
        if _is_lfs(path):
            digest = _sha256(data)
            headers |= {
                "X-Linked-Etag": f'"{digest}"',
                "X-Linked-Size": str(len(data)),
                "Location": f"{self.storage.url}/{digest}",
            }
            return web.Response(status=302, headers=headers)
        status, body = 200, data
        ranged = _parse_range(request.headers.get("Range", ""), len(data))
        if ranged == "unsatisfiable":
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        if isinstance(ranged, tuple):
            first, last = ranged
            status, body = 206, data[first : last + 1]
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(body))
            return web.Response(status=status, headers=headers)
        return web.Response(status=status, body=body, headers=headers)


def _file_entry(path: str, data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": _git_oid(data), "size": len(data), "path": path}
    if _is_lfs(path):
        entry["lfs"] = {
            "oid": _sha256(data),
            "size": len(data),
            "pointerSize": 134,
        }
    return entry


def _error(status: int, code: str, message: str) -> web.Response:
    headers = {"X-Error-Message": message}
    if code:
        headers["X-Error-Code"] = code
    return web.json_response({"error": message}, status=status, headers=headers)
