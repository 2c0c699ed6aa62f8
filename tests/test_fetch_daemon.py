"""``aioloader fetch --daemon URL SRC DEST``: the node's daemon downloads the model, fetch
copies it from the daemon's cache (daemon_client.py). A real daemon, a real origin; a
daemon that lies is a small aiohttp server of this file, answering over real sockets."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web
from safetensors.torch import load_file

from aioloader.cache.entry import key_of
from aioloader.fetch.copy import PARTIAL_PREFIX, RECORD
from aioloader.sources.http.rules import PROBE_SIZE

from .daemon_helpers import TOKEN, free_port, running, write_model
from .helpers import flip_byte
from .http_server import FaultyHttpServer

_SMALL = 2 * PROBE_SIZE  # the most of a file fetch reads to open it (and an index)
CONFIGS = {"config.json": b'{"model_type": "test"}', "tokenizer.json": b'{"v": 1}'}


def _model(folder: Path, seed: int = 0) -> tuple[dict[str, bytes], list[str]]:
    """An indexed model of 3 shards with config files: (name -> bytes, weight names)."""
    index, shards = write_model(folder, shards=3, kib=1024, seed=seed)
    for name, data in CONFIGS.items():
        (folder / name).write_bytes(data)
    weights = [index.name, *(s.name for s in shards)]
    return {p.name: p.read_bytes() for p in folder.iterdir()}, weights


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name != RECORD
    }


def _env(token: str | None = TOKEN, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    if token is not None:
        env["AIOLOADER_TOKEN"] = token
    return {**env, **more}


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "aioloader", "fetch", *args]


def _fetch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(*args), capture_output=True, text=True, timeout=120, check=False,
        env=_env() if env is None else env,
    )  # fmt: skip


def _assert_same_tensors(dest: Path, src: Path, shards: list[str]) -> None:
    for name in shards:
        if name.endswith(".safetensors"):
            got, want = load_file(dest / name), load_file(src / name)
            assert got.keys() == want.keys()
            assert all(torch.equal(got[k], want[k]) for k in want), name


def test_fetch_copies_what_the_daemon_holds(tmp_path: Path, http_server: FaultyHttpServer) -> None:
    want, weights = _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    with running(tmp_path / "cache", token=TOKEN) as daemon:
        out = _fetch("--daemon", daemon.url, src, str(tmp_path / "a"))
        assert out.returncode == 0, out.stderr + daemon.output()
        assert _files(tmp_path / "a") == want
        _assert_same_tensors(tmp_path / "a", http_server.root / "m", weights)
        assert f"from the daemon at {daemon.url}" in out.stderr
        assert "the daemon's copy is ready" in out.stderr
        # The second fetch reads no weight from the origin (the daemon holds them): only
        # the index, to list the files, the config files, which fetch copies itself, and
        # the first bytes of each file, as opening it reads them (its size and version).
        before = http_server.bytes_sent
        out = _fetch("--daemon", daemon.url, src, str(tmp_path / "b"))
        assert out.returncode == 0, out.stderr
        assert _files(tmp_path / "b") == want
        assert http_server.bytes_sent - before <= _SMALL * len(want), out.stderr
        # Config files come from the origin, fetched by fetch itself.
        assert http_server.gets("/m/config.json")


def test_two_fetches_of_one_model_at_once(tmp_path: Path, http_server: FaultyHttpServer) -> None:
    want, weights = _model(http_server.root / "m", seed=3)
    src = http_server.url_for("m/model.safetensors.index.json")
    with running(tmp_path / "cache", token=TOKEN) as daemon:
        dests = [tmp_path / "a", tmp_path / "a", tmp_path / "b"]  # two into one DEST too
        procs = [
            subprocess.Popen(
                _command("--daemon", daemon.url, src, str(d)),
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for d in dests
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        for dest in set(dests):
            assert _files(dest) == want
            assert not list(dest.glob(PARTIAL_PREFIX + "*"))
        # One download of the shards, by the daemon, however many fetches asked.
        shards = sum(len(want[n]) for n in weights[1:])
        assert shards <= http_server.bytes_sent <= shards + _SMALL * len(want) * len(dests)


@pytest.mark.parametrize(
    ("flags", "env", "said"),
    [
        (["--daemon", ""], {}, "must be the daemon's URL"),
        (["--daemon", "ftp://node:8790"], {}, "is not an http:// URL"),
        (["--daemon", "http://u:secret@node:8790"], {}, "holds user info"),
        (["--daemon", "http://node:8790/?a=b"], {}, "has a query"),
        (["--daemon", "http://node:99999"], {}, "port out of range"),
        (["--daemon", "http://" + "a" * 5000], {}, "characters long"),
        (["--daemon", "http://no de:1"], {}, "whitespace"),
        ([], {"AIOLOADER_DAEMON": "node:8790"}, "AIOLOADER_DAEMON 'node:8790' is not an http"),
        (["--daemon", "http://n:1", "--daemon-wait", "-1"], {}, "must be above 0"),
        (["--daemon", "http://n:1", "--daemon-wait", "nan"], {}, "must be above 0"),
        (["--daemon", "http://n:1", "--daemon-wait", "1e99"], {}, "at most"),
        (["--daemon", "http://n:1", "--daemon-wait", "soon"], {}, "not a number of seconds"),
        (["--daemon", "http://n:1"], {"AIOLOADER_DAEMON_WAIT": "x"}, "AIOLOADER_DAEMON_WAIT"),
    ],
)
def test_bad_daemon_settings_are_refused_naming_them(
    tmp_path: Path, flags: list[str], env: dict[str, str], said: str
) -> None:
    out = _fetch(*flags, "s3://bucket/m/", str(tmp_path / "dest"), env=_env(**env))
    assert out.returncode == 1, out.stderr
    assert said in out.stderr and "Traceback" not in out.stderr
    assert "secret" not in out.stderr
    assert not (tmp_path / "dest").exists()


def test_a_daemon_not_there_wrong_token_and_failed_model(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    nobody = f"http://127.0.0.1:{free_port()}"
    out = _fetch("--daemon", nobody, src, str(tmp_path / "dest"))
    assert out.returncode == 1
    assert f"the daemon at {nobody} cannot be reached" in out.stderr
    with running(tmp_path / "cache", token=TOKEN) as daemon:
        out = _fetch("--daemon", daemon.url, src, str(tmp_path / "dest"), env=_env("x" * 32))
        assert out.returncode == 1
        assert f"the daemon at {daemon.url} refused the token (401)" in out.stderr
        assert "--token or AIOLOADER_TOKEN" in out.stderr
        gone = http_server.url_for("gone/model.safetensors.index.json")
        out = _fetch("--daemon", daemon.url, gone, str(tmp_path / "dest"))
        assert out.returncode == 1
        assert f"the daemon at {daemon.url} could not fetch {gone}" in out.stderr
        assert "404" in out.stderr or "not found" in out.stderr.lower()
    assert not (tmp_path / "dest").exists()


# -- a daemon that lies --------------------------------------------------------------


class _Liar:
    """Answers the daemon's routes as ``record`` and ``file`` say."""

    def __init__(self) -> None:
        self.record: Callable[[], web.StreamResponse] = lambda: web.json_response(_rec("queued"))
        self.file: Callable[[web.Request], Any] = lambda request: web.Response(status=404)
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        async def record(request: web.Request) -> web.StreamResponse:
            return self.record()

        async def file(request: web.Request) -> Any:
            return await self.file(request)

        app = web.Application()
        app.router.add_post("/v1/models", record)
        app.router.add_get("/v1/models/{id}", record)
        app.router.add_get("/v1/models/{id}/files/{key}", file)
        return app


def _rec(status: str, **more: Any) -> dict[str, Any]:
    return {"id": "m-1", "status": status, "bytes_done": 0, "bytes_total": None, **more}


@pytest.fixture
async def liar() -> AsyncIterator[_Liar]:
    liar = _Liar()
    # Short: a handler stalled on purpose (a fetch killed mid-copy) held the teardown for
    # aiohttp's default of 60 s.
    runner = web.AppRunner(liar.app(), shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", liar.port).start()
    try:
        yield liar
    finally:
        await runner.cleanup()


async def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *_command(*args), env=env or _env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (lambda: web.json_response(_rec("queued")), "made no progress on"),
        (lambda: web.json_response({"detail": "boom"}, status=500), "failed on POST"),
        (lambda: web.json_response(_rec("bogus")), "unknown status"),
        (lambda: web.json_response(_rec("ready", bytes_done=-5)), "bad bytes_done"),
        (lambda: web.json_response(["not", "a", "record"]), "not a JSON object"),
        (lambda: web.Response(body=b"[" + b" " * (2 << 20) + b"]"), "more than"),
        (lambda: web.json_response(_rec("failed", error="origin said 403")), "origin said 403"),
    ],
)
async def test_a_lying_daemon_fails_the_fetch_clearly(
    tmp_path: Path, liar: _Liar, answer: Callable[[], web.StreamResponse], said: str
) -> None:
    liar.record = answer
    dest = tmp_path / "dest"
    rc, err = await _run("--daemon", liar.url, "--daemon-wait", "0.5", "s3://b/m/", str(dest))
    assert rc == 1 and said in err, err
    assert liar.url in err and "Traceback" not in err
    assert not dest.exists()


async def test_files_the_daemon_lies_about_come_from_the_origin_or_fail(
    tmp_path: Path, liar: _Liar, http_server: FaultyHttpServer
) -> None:
    want, weights = _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    liar.record = lambda: web.json_response(_rec("ready"))

    async def wrong_size(request: web.Request) -> web.Response:
        return web.Response(body=b"short")

    liar.file = wrong_size  # another version: read from the origin instead
    rc, err = await _run("--daemon", liar.url, src, str(tmp_path / "a"))
    assert rc == 0, err
    assert _files(tmp_path / "a") == want and "another version" in err

    async def cut(request: web.Request) -> web.StreamResponse:
        size = len(want[weights[1]])
        vouched = {"X-Aioloader-Checksum": _xxh3(want[weights[1]])}
        response = web.StreamResponse(headers={"Content-Length": str(size), **vouched})
        await response.prepare(request)
        await response.write(b"x" * (size // 2))
        assert request.transport is not None
        request.transport.close()  # half the promised body, then the connection drops
        return response

    liar.file = cut
    rc, err = await _run("--daemon", liar.url, src, str(tmp_path / "b"))
    assert rc == 1 and f"the daemon at {liar.url} stopped sending" in err, err
    assert not (tmp_path / "b").exists() or _files(tmp_path / "b") == {}
    assert not list((tmp_path / "b").glob(PARTIAL_PREFIX + "*"))


async def test_a_fetch_killed_while_copying_leaves_no_half_file(
    tmp_path: Path, liar: _Liar, http_server: FaultyHttpServer
) -> None:
    want, weights = _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    dest = tmp_path / "dest"
    (dest / "keep.txt").parent.mkdir()
    (dest / "keep.txt").write_bytes(b"mine")
    liar.record = lambda: web.json_response(_rec("ready"))
    started = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        size = len(want[weights[1]])
        vouched = {"X-Aioloader-Checksum": _xxh3(want[weights[1]])}
        response = web.StreamResponse(headers={"Content-Length": str(size), **vouched})
        await response.prepare(request)
        await response.write(b"x" * 4096)
        started.set()
        await asyncio.sleep(3600)
        return response

    liar.file = stall
    proc = await asyncio.create_subprocess_exec(
        *_command("--daemon", liar.url, src, str(dest)), env=_env(),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.wait_for(started.wait(), 60)
    deadline = time.monotonic() + 30
    while not any(p.stat().st_size for p in dest.glob(PARTIAL_PREFIX + "*/**/*") if p.is_file()):
        assert time.monotonic() < deadline, "no partial file was written"
        await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    # Killed mid-copy: no file under a final name but the one DEST had.
    assert _files(dest).keys() - {"keep.txt"} <= {
        p.relative_to(dest).as_posix() for p in dest.glob(PARTIAL_PREFIX + "*/**/*")
    }
    assert not (dest / weights[1]).exists() and not (dest / RECORD).exists()
    # The next fetch, through a daemon that tells the truth, completes and cleans up.
    with running(tmp_path / "cache", token=TOKEN) as daemon:
        rc, err = await _run("--daemon", daemon.url, src, str(dest))
    assert rc == 0, err
    assert _files(dest) == {**want, "keep.txt": b"mine"}
    assert not list(dest.glob(PARTIAL_PREFIX + "*"))
    assert json.loads((dest / RECORD).read_text())["complete"] is True


def test_the_daemon_serves_only_files_of_its_ready_models(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    want, weights = _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    with running(tmp_path / "cache", token=TOKEN) as daemon:
        status, record = daemon.post({"url": src})
        assert status in (200, 202)
        daemon.wait_status(record["id"], "ready")
        shard = http_server.url_for(f"m/{weights[1]}")
        path = f"/v1/models/{record['id']}/files/{key_of(shard)}"
        status, _ = daemon.get(path, token="")
        assert status == 401  # behind the token, as every /v1/ route
        request = urllib.request.Request(
            daemon.url + path, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.read() == want[weights[1]]
        config = http_server.url_for("m/config.json")
        for key in (key_of(config), "0" * 64, "..%2F..%2Fetc%2Fpasswd"):
            status, body = daemon.get(f"/v1/models/{record['id']}/files/{key}")
            assert status == 404, body


# -- the daemon's token from a file (issue 42) -----------------------------------------------


def test_fetch_reads_the_daemons_token_from_a_file(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    want, weights = _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    with running(tmp_path / "cache", "--token-file", str(path)) as daemon:
        out = _fetch("--daemon", daemon.url, "--token-file", str(path), src,
                     str(tmp_path / "a"), env=_env(token=None))  # fmt: skip
        assert out.returncode == 0, out.stderr + daemon.output()
        assert _files(tmp_path / "a") == want
        _assert_same_tensors(tmp_path / "a", http_server.root / "m", weights)
        out = _fetch("--daemon", daemon.url, src, str(tmp_path / "b"),
                     env=_env(token=None, AIOLOADER_TOKEN_FILE=str(path)))  # fmt: skip
        assert out.returncode == 0, out.stderr
        # Given twice: an error naming both, before anything is asked.
        out = _fetch("--daemon", daemon.url, "--token-file", str(path), src, str(tmp_path / "c"))
        assert out.returncode == 1 and "--token-file" in out.stderr
        assert "AIOLOADER_TOKEN " in out.stderr and TOKEN not in out.stderr
        out = _fetch("--daemon", daemon.url, "--token-file", str(tmp_path / "nope"), src,
                     str(tmp_path / "c"), env=_env(token=None))  # fmt: skip
        assert out.returncode == 1 and str(tmp_path / "nope") in out.stderr
        assert "Traceback" not in out.stderr and not (tmp_path / "c").exists()


# -- the bytes fetch copies from the daemon are checked (issue 42) --------------------------


def _entry_data(cache: Path, url: str) -> Path:
    return cache / "entries" / key_of(url) / "data"


def test_a_daemon_copy_altered_on_disk_never_reaches_dest(
    tmp_path: Path, http_server: FaultyHttpServer
) -> None:
    want, weights = _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    shard = http_server.url_for(f"m/{weights[2]}")
    with running(tmp_path / "cache", token=TOKEN) as daemon:
        out = _fetch("--daemon", daemon.url, src, str(tmp_path / "a"))
        assert out.returncode == 0, out.stderr + daemon.output()
        flip_byte(_entry_data(tmp_path / "cache", shard), len(want[weights[2]]) // 2)
        dest = tmp_path / "b"
        (dest / "keep.txt").parent.mkdir()
        (dest / "keep.txt").write_bytes(b"mine")
        # Two jobs at once, into one DEST and into another: both refuse the copy.
        procs = [
            subprocess.Popen(
                _command("--daemon", daemon.url, src, str(where)),
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for where in (dest, dest, tmp_path / "c")
        ]
        outs = [(p.wait(120), p.communicate()[1]) for p in procs]
    for rc, err in outs:
        assert rc == 1, err
        for words in (f"the daemon at {daemon.url}", weights[2], "checksum", "cache verify"):
            assert words in err, err
    assert _files(dest) == {"keep.txt": b"mine"} and not list(dest.glob(PARTIAL_PREFIX + "*"))
    assert _files(tmp_path / "c") == {}


def _xxh3(data: bytes) -> str:
    import xxhash

    return f"xxh3-128:{xxhash.xxh3_128(data).hexdigest()}"


async def test_a_daemon_that_sends_other_bytes_is_caught_by_the_hubs_digest(
    tmp_path: Path, liar: _Liar, hub: Any
) -> None:
    """A daemon that vouches for its wrong bytes (their own checksum) still fails the
    fetch: the Hub publishes the file's sha256."""
    folder = tmp_path / "src"
    _, weights = _model(folder)
    hub.commit("org/m", {p.name: p.read_bytes() for p in folder.iterdir()})
    liar.record = lambda: web.json_response(_rec("ready"))
    shard = (folder / weights[1]).read_bytes()

    async def other_bytes(request: web.Request) -> web.Response:
        wrong = bytes(b ^ 0x01 for b in shard)
        return web.Response(body=wrong, headers={"X-Aioloader-Checksum": _xxh3(wrong)})

    liar.file = other_bytes
    dest = tmp_path / "dest"
    env = _env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hf"), HF_TOKEN_PATH="/nonexistent")
    rc, err = await _run("--daemon", liar.url, "hf://org/m", str(dest), env=env)
    assert rc == 1, err
    assert "sha256" in err and liar.url in err and "Traceback" not in err
    assert not dest.exists() or _files(dest) == {}


async def test_a_daemon_copy_of_another_version_or_unvouched_is_read_from_the_origin(
    tmp_path: Path, liar: _Liar, http_server: FaultyHttpServer
) -> None:
    want, weights = _model(http_server.root / "m")
    src = http_server.url_for("m/model.safetensors.index.json")
    liar.record = lambda: web.json_response(_rec("ready"))
    by_key = {key_of(http_server.url_for(f"m/{name}")): want[name] for name in weights}

    async def stale(request: web.Request) -> web.Response:
        if request.match_info["key"] not in by_key:
            return web.Response(status=404)
        wrong = bytes(len(by_key[request.match_info["key"]]))
        headers = {"X-Aioloader-Checksum": _xxh3(wrong), "X-Aioloader-Etag": '"old-version"'}
        return web.Response(body=wrong, headers=headers)

    liar.file = stale
    rc, err = await _run("--daemon", liar.url, src, str(tmp_path / "a"))
    assert rc == 0, err
    assert _files(tmp_path / "a") == want and "another version" in err

    # No checksum, or none of this form (wrong algorithm, upper case, huge, empty).
    for n, said in enumerate([None, "md5:" + "0" * 32, "XXH3-128:" + "A" * 32, "x" * 6000, ""]):

        async def unvouched(request: web.Request, said: str | None = said) -> web.Response:
            if request.match_info["key"] not in by_key:
                return web.Response(status=404)
            headers = {} if said is None else {"X-Aioloader-Checksum": said}
            return web.Response(body=bytes(len(by_key[request.match_info["key"]])), headers=headers)

        liar.file = unvouched
        rc, err = await _run("--daemon", liar.url, src, str(tmp_path / f"b{n}"))
        assert rc == 0, err
        assert _files(tmp_path / f"b{n}") == want and "no checksum" in err
    _assert_same_tensors(tmp_path / "b0", http_server.root / "m", weights)
