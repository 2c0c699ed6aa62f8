"""``aioloader serve``, run as a real subprocess against the local HTTP server and moto S3."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from safetensors.torch import load_file

from aioloader.cache.entry import EntryFiles, key_of, read_meta

from .daemon_helpers import TOKEN, Daemon, final_files, running, single_file, write_model
from .helpers import assert_matches_files
from .servers import FaultyHttpServer, MotoS3Server

pytest.importorskip("prometheus_client")

PROBE = 256 * 1024  # the first GET of a file reads this much (HttpSource.PROBE_SIZE)


def _entry(cache: Path, url: str) -> Path:
    return cache / "entries" / key_of(url)


def _complete(cache: Path, url: str) -> bool:
    meta = read_meta(EntryFiles.of(cache, url))
    return meta is not None and meta.complete


def _check_final_files(cache: Path, sources: dict[str, Path]) -> None:
    """Every file under a final name is complete and byte-identical to its source."""
    for path in final_files(cache):
        if path.parent.parent.name == "entries":
            meta = (path.parent / "meta.json").read_text()
            url = next(u for u in sources if f'"{u}"' in meta)
            assert path.read_bytes() == sources[url].read_bytes(), path
        else:
            # A model's link may outlive an evicted entry (a load then fails as not
            # found), but never points at a partial one.
            target = path.resolve()
            assert target.exists() or not (target.parent / "meta.json").exists(), path


def test_probes_metrics_and_restart(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    index, shards = write_model(http_server.root / "llama", shards=2, kib=300)
    url = http_server.url_for("llama/model.safetensors.index.json")
    cache = tmp_path / "cache"
    # Hold the index back a moment, so the probes see the preload in progress.
    http_server.stall("llama/model.safetensors.index.json", 1.5, before_headers=True)
    with running(cache, "--model", url) as daemon:
        status, body = daemon.get("/health")
        assert (status, body) == (200, {"status": "ok"})
        status, body = daemon.get("/ready")
        assert status == 503 and body["ready"] is False
        assert [m["url"] for m in body["missing"]] == [url]
        assert body["missing"][0]["status"] in ("queued", "downloading")
        daemon.wait_ready()
        model_id = body["missing"][0]["id"]
        record = daemon.model(model_id)
        assert record["status"] == "ready" and record["cache_hit"] is False
        assert record["bytes_done"] == record["bytes_total"] > 600 * 1024
        assert daemon.get(f"/ready?model={model_id}")[0] == 200
        assert daemon.get("/ready", token=None)[0] == 200
        # What the cache hands out loads bit for bit like the originals.
        links = sorted(Path(record["path"]).parent.glob("*.safetensors"))
        got = {k: v for f in links for k, v in load_file(str(f)).items()}
        assert_matches_files(got, *shards)

        m = daemon.metrics()
        assert m["aioloader_daemon_fetched_bytes_total"] >= record["bytes_total"]
        assert m["aioloader_daemon_cache_misses_total"] == 1
        assert m["aioloader_daemon_cache_hits_total"] == 0
        assert m["aioloader_daemon_load_seconds_count{outcome=downloaded}"] == 1
        assert m["aioloader_daemon_downloads_in_flight"] == 0
        assert m["aioloader_daemon_models{status=ready}"] == 1
        assert "aioloader_daemon_throughput_bytes_per_second" in m
        assert daemon.stop() == 0
    assert "stopped" in daemon.output()

    # Restarted on the same cache: a hit, nothing downloaded again.
    http_server.reset_counters()
    with running(cache, "--model", url) as daemon:
        daemon.wait_ready()
        m = daemon.metrics()
        assert m["aioloader_daemon_cache_hits_total"] == 1
        assert m["aioloader_daemon_cache_misses_total"] == 0
        assert m["aioloader_daemon_fetched_bytes_total"] == 0
        assert daemon.stop() == 0
    assert http_server.bytes_sent < 2 * PROBE + 4096  # version checks only
    _check_final_files(cache, {http_server.url_for(f"llama/{p.name}"): p for p in [index, *shards]})


def test_s3_model(s3_env: MotoS3Server, tmp_path: Path) -> None:
    src = single_file(tmp_path / "src" / "model.safetensors", kib=200)
    s3_env.upload("daemon-bucket", "tiny", src)
    with running(tmp_path / "cache", "--allow-prefix", "s3://daemon-bucket/") as daemon:
        status, body = daemon.post({"url": "s3://daemon-bucket/tiny/", "id": "tiny"})
        assert status == 202 and body["id"] == "tiny"
        record = daemon.wait_status("tiny", "ready")
        assert record["bytes_total"] == src.stat().st_size
        assert daemon.get("/ready?model=s3://daemon-bucket/tiny/")[0] == 200
        assert daemon.stop() == 0


def test_single_flight(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    src = single_file(http_server.root / "one.safetensors", kib=2048)
    url = http_server.url_for("one.safetensors")
    # Slow the first GET, so every client arrives while the download runs.
    http_server.stall("one.safetensors", 1.0, before_headers=True)
    with running(tmp_path / "cache") as daemon:
        barrier = threading.Barrier(8)

        def post(_: int) -> tuple[int, str]:
            barrier.wait()
            status, body = daemon.post({"url": url})
            return status, body["id"]

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(post, range(8)))
        ids = {i for _, i in results}
        assert len(ids) == 1, results
        assert sorted(s for s, _ in results) == [200] * 7 + [202]
        model_id = ids.pop()

        def watch(_: int) -> str:
            daemon.wait_status(model_id, "ready")
            return str(daemon.model(model_id)["status"])

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(watch, range(4))) == ["ready"] * 4
        # One more POST once it is ready: nothing new.
        assert daemon.post({"url": url})[0] == 200
        assert daemon.stop() == 0
    size = src.stat().st_size
    assert len(http_server.gets("one.safetensors")) <= 2  # the probe, then the rest
    assert size <= http_server.bytes_sent <= size + PROBE


def test_two_daemons_share_one_download(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    src = single_file(http_server.root / "shared.safetensors", kib=2048)
    url = http_server.url_for("shared.safetensors")
    http_server.stall("shared.safetensors", 0.0)
    http_server.stall("shared.safetensors", 1.0, after_bytes=PROBE)  # the data GET
    cache = tmp_path / "cache"
    with running(cache) as one, running(cache) as two:
        assert one.post({"url": url, "id": "m"})[0] == 202
        one.wait_for(lambda: http_server.in_flight >= 1, 10, "the download")
        assert two.post({"url": url, "id": "m"})[0] == 202
        assert two.wait_status("m", "ready")["cache_hit"] is True  # waited on the lock
        assert one.wait_status("m", "ready")["cache_hit"] is False
        assert one.stop() == 0 and two.stop() == 0
    size = src.stat().st_size
    assert size <= http_server.bytes_sent <= size + 2 * PROBE + 4096


def test_crash_mid_download_then_resume(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    index, shards = write_model(http_server.root / "m", shards=3, kib=1024)
    url = http_server.url_for("m/model.safetensors.index.json")
    shard_urls = [http_server.url_for(f"m/{p.name}") for p in shards]
    last = f"m/{shards[-1].name}"
    # The last shard's probe passes; its data GET stops after 64 KiB.
    http_server.stall(last, 0.0)
    http_server.stall(last, 60, after_bytes=64 * 1024)
    cache = tmp_path / "cache"
    daemon = Daemon(cache, "--model", url).start()
    try:
        # Complete means meta.json says so: ``data`` appears a moment before (partial.py
        # renames, then marks), and a kill in between downloads that shard again.
        daemon.wait_for(
            lambda: all(_complete(cache, u) for u in shard_urls[:2]), 20, "the first two shards"
        )
        daemon.wait_for(lambda: http_server.in_flight >= 1, 10, "the stalled GET")
    finally:
        daemon.kill()  # SIGKILL: no cleanup at all
    assert not (_entry(cache, shard_urls[2]) / "data").exists()

    http_server.clear_faults()
    http_server.reset_counters()
    with running(cache, "--model", url) as daemon:
        daemon.wait_ready()
        assert daemon.stop() == 0
    # The complete shards are only checked (one probe each); the last one is fetched.
    for shard in shards[:2]:
        assert len(http_server.gets(f"m/{shard.name}")) == 1
    assert http_server.bytes_sent <= 3 * PROBE + shards[-1].stat().st_size + 4096
    _check_final_files(cache, {http_server.url_for(f"m/{p.name}"): p for p in [index, *shards]})


def test_eviction_under_small_cache(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    a = single_file(http_server.root / "a.safetensors", kib=600, seed=1)
    b = single_file(http_server.root / "b.safetensors", kib=600, seed=2)
    urls = {http_server.url_for(p.name): p for p in (a, b)}
    url_a, url_b = urls
    with running(tmp_path / "cache", "--max-cache-bytes", "1MiB") as daemon:
        assert daemon.post({"url": url_a, "id": "a"})[0] == 202
        daemon.wait_status("a", "ready")
        assert daemon.post({"url": url_b, "id": "b"})[0] == 202
        daemon.wait_status("b", "ready")
        assert daemon.model("a")["status"] == "evicted"
        # Models added through the API never hold the node's readiness: listed, not missing.
        status, body = daemon.get("/ready")
        assert status == 200 and body["missing"] == [], body
        assert [m["id"] for m in body["pending"]] == ["a"]
        assert daemon.get("/ready?model=a")[0] == 503
        assert daemon.get("/ready?model=b")[0] == 200
        assert daemon.metrics()["aioloader_daemon_cache_evictions_total"] >= 1
        # Asking again brings it back (and pushes b out).
        assert daemon.post({"url": url_a})[0] == 202
        daemon.wait_status("a", "ready")
        assert daemon.model("b")["status"] == "evicted"
        assert daemon.stop() == 0
    assert not (_entry(tmp_path / "cache", url_b) / "data").exists()
    _check_final_files(tmp_path / "cache", urls)


def test_sigterm_and_delete_with_downloads_in_flight(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    for name in ("x", "y"):
        single_file(http_server.root / f"{name}.safetensors", kib=1024)
        http_server.stall(f"{name}.safetensors", 0.0)
        http_server.stall(f"{name}.safetensors", 60, after_bytes=512 * 1024)
    cache = tmp_path / "cache"
    with running(cache, "--grace-period", "5") as daemon:
        for name in ("x", "y"):
            body = {"url": http_server.url_for(f"{name}.safetensors"), "id": name}
            assert daemon.post(body)[0] == 202
        daemon.wait_for(lambda: http_server.in_flight >= 2, 10, "both downloads stalled")
        assert daemon.model("x")["status"] == "downloading"

        # DELETE cancels a download in flight and drops its partial entry.
        assert daemon.request("DELETE", "/v1/models/x") == (200, {"id": "x", "deleted": True})
        assert daemon.get("/v1/models/x")[0] == 404
        entry = _entry(cache, http_server.url_for("x.safetensors"))
        assert not any((entry / n).exists() for n in ("meta.json", "data", "data.partial"))

        started = time.monotonic()
        assert daemon.stop(signal.SIGTERM) == 0
        assert time.monotonic() - started < 5.0
    assert final_files(cache) == []
    assert (_entry(cache, http_server.url_for("y.safetensors")) / "data.partial").exists()


def test_bad_input(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    allowed = http_server.url + "/allowed/"
    with running(tmp_path / "cache", "--allow-prefix", allowed, token=TOKEN) as daemon:
        # Probes and metrics are open; the API needs the token.
        assert daemon.get("/health", token="")[0] == 200
        assert daemon.get("/ready", token="")[0] == 200
        assert daemon.get("/metrics", token="")[0] == 200
        for token in ("", "wrong"):
            status, body = daemon.get("/v1/models", token=token)
            assert status == 401 and body["error"] == "unauthorized"
        assert daemon.post({"url": allowed + "m.safetensors"}, token="nope")[0] == 401

        def refused(status: int, error: str, **kw: object) -> dict[str, object]:
            got, body = daemon.post(**kw)  # type: ignore[arg-type]
            assert (got, body["error"]) == (status, error), body
            assert body["detail"]
            return body  # type: ignore[no-any-return]

        refused(400, "bad_json", raw=b"{not json")
        refused(400, "bad_json", raw=b'["a list"]')
        refused(400, "bad_json", raw=b"")
        refused(400, "bad_json", raw=b"\xff\xfe{}")
        # Nested past the parser's limit, yet under the size limit: a JSON 400, no traceback.
        refused(400, "too_deep", raw=b"[" * 30000 + b"]" * 30000)
        refused(400, "too_deep", raw=b'{"url": ' + b"[" * 30000 + b"]" * 30000 + b"}")
        body = refused(413, "body_too_large", raw=b'{"url": "' + b"x" * 70000 + b'"}')
        assert "64 KiB" in str(body["detail"])
        body = refused(400, "unknown_fields", body={"url": allowed + "m", "colour": 1, "x": 2})
        assert body["fields"] == ["colour", "x"] and "colour" in str(body["detail"])
        refused(400, "missing_url", body={})
        refused(400, "missing_url", body={"url": 42})
        refused(400, "unsupported_scheme", body={"url": "ftp://host/model.safetensors"})
        refused(400, "unsupported_scheme", body={"url": "/models/llama"})
        # An unbalanced "[" in the host: its scheme cannot even be read (a 500 before).
        body = refused(400, "bad_url", body={"url": "https://[::1/models"})
        assert "[::1/models" in str(body["detail"])
        refused(400, "bad_id", body={"url": allowed + "m.safetensors", "id": "../etc"})
        refused(403, "url_not_allowed", body={"url": "https://elsewhere/m.safetensors"})
        refused(403, "url_not_allowed", body={"url": allowed + "../secret.safetensors"})
        refused(403, "url_not_allowed", body={"url": allowed + "%2e%2e/secret.safetensors"})
        refused(403, "url_not_allowed", body={"url": allowed + "..%2fsecret.safetensors"})
        refused(403, "url_not_allowed", body={"url": allowed[:-1] + "-evil/m.safetensors"})

        # A model that does not exist upstream fails; the daemon keeps serving.
        status, body = daemon.post({"url": allowed + "missing.safetensors", "id": "gone"})
        assert status == 202
        record = daemon.wait_status("gone", "failed")
        assert record["error_kind"] == "NotFoundError" and "missing.safetensors" in record["error"]
        refused(409, "conflict", body={"url": allowed + "other.safetensors", "id": "gone"})
        status, body = daemon.get("/ready")
        assert status == 200 and body["pending"][0]["error"]  # no preload: the node is ready
        assert daemon.get("/ready?model=gone")[0] == 503
        assert daemon.metrics()["aioloader_daemon_errors_total{kind=NotFoundError}"] >= 1

        assert daemon.get("/v1/models/nope")[0] == 404
        assert daemon.get("/ready?model=nope")[0] == 404
        assert daemon.request("DELETE", "/v1/models/nope")[0] == 404
        status, body = daemon.get("/no/such/route")
        assert status == 404 and body["error"] == "not_found"
        assert daemon.request("PUT", "/v1/models")[0] == 405
        assert daemon.request("DELETE", "/v1/models/gone")[0] == 200
        assert daemon.get("/v1/models")[1] == {"models": []}
        assert daemon.get("/health")[0] == 200
        assert daemon.stop() == 0
    assert TOKEN not in daemon.output()


def test_full_disk_fails_the_model(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    big = single_file(http_server.root / "big.safetensors", kib=1024)
    small = single_file(http_server.root / "small.safetensors", kib=64)
    cache = tmp_path / "cache"
    # No file in the cache may grow past 512 KiB: "disk full" for the big model only.
    with running(cache, fsize_limit=512 * 1024) as daemon:
        assert daemon.post({"url": http_server.url_for("big.safetensors"), "id": "big"})[0] == 202
        record = daemon.wait_status("big", "failed")
        assert record["error_kind"] == "CacheError" and str(cache) in record["error"]
        assert daemon.post({"url": http_server.url_for("small.safetensors"), "id": "s"})[0] == 202
        daemon.wait_status("s", "ready")
        assert daemon.stop() == 0
    _check_final_files(cache, {http_server.url_for(p.name): p for p in (big, small)})
    assert not (_entry(cache, http_server.url_for("big.safetensors")) / "data").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache-dir", "{blocker}/cache"], "not writable"),
        (["--max-cache-bytes", "lots"], "max cache bytes"),
        (["--model", "ftp://host/m.safetensors"], "not supported"),
        (["--port", "70000"], "port"),
        (["--allow-prefix", "https://user@h/models/"], "allowed prefix"),
    ],
)
def test_refuses_to_start(tmp_path: Path, args: list[str], message: str) -> None:
    import subprocess
    import sys

    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    argv = [a.format(blocker=blocker) for a in args]
    if "--cache-dir" not in argv:
        argv += ["--cache-dir", str(tmp_path / "cache")]
    out = subprocess.run(
        [sys.executable, "-m", "aioloader", "serve", *argv],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_config_from_flags_and_environment(tmp_path: Path) -> None:
    import argparse

    from aioloader.daemon.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {
        "AIOLOADER_HOST": "0.0.0.0",
        "AIOLOADER_PORT": "9000",
        "AIOLOADER_CACHE_DIR": str(tmp_path),
        "AIOLOADER_MAX_CACHE_BYTES": "2GiB",
        "AIOLOADER_MODELS": "s3://b/a/, s3://b/c/,,s3://b/a/",
        "AIOLOADER_TOKEN": TOKEN,
        "AIOLOADER_ALLOW_PREFIXES": "s3://b/",
        "AIOLOADER_GRACE_PERIOD": "7.5",
    }
    config = config_from_args(parser.parse_args([]), env)
    assert (config.host, config.port, config.cache_dir) == ("0.0.0.0", 9000, tmp_path)
    assert config.max_cache_bytes == 2 << 30 and config.grace_period == 7.5
    assert config.models == ("s3://b/a/", "s3://b/c/") and config.allow_prefixes == ("s3://b/",)
    assert config.token == TOKEN and TOKEN not in repr(config)
    # A flag wins over its variable.
    other = TOKEN[::-1]
    flags = parser.parse_args(["--port", "1234", "--model", "s3://x/y/", "--token", other])
    config = config_from_args(flags, env)
    assert (config.port, config.models, config.token) == (1234, ("s3://x/y/",), other)
    # Nothing set: the defaults, listening on loopback only.
    config = config_from_args(parser.parse_args([]), {"HOME": str(tmp_path)})
    assert (config.host, config.port, config.token) == ("127.0.0.1", 8790, None)
    assert config.cache_dir == tmp_path / ".cache" / "aioloader"


def test_model_ids_and_displayed_urls() -> None:
    from aioloader.daemon.state import Registry, display_url, model_id_for

    a = model_id_for("s3://models/llama-3-8b/model.safetensors.index.json")
    assert a.startswith("llama-3-8b-") and a == model_id_for(
        "s3://models/llama-3-8b/model.safetensors.index.json"
    )
    assert model_id_for("https://h/x/embedder.safetensors").startswith("embedder-")
    assert display_url("https://user:pw@h:8443/m.safetensors?X-Amz-Signature=abc") == (
        "https://REDACTED@h:8443/m.safetensors?X-Amz-Signature=REDACTED"
    )
    registry = Registry()
    first = registry.add("s3://b/m/")
    assert registry.add("s3://b/m/") is first and registry.find("s3://b/m/") is first
    with pytest.raises(KeyError):
        registry.add("s3://b/other/", first.id)
    # The node's readiness is its preloads'; a model added through the API is pending.
    ready, body = registry.readiness()
    assert (
        ready is True and body["models"] == 0 and [m["id"] for m in body["pending"]] == [first.id]
    )
    preload = registry.add("s3://b/kept/", preload=True)
    ready, body = registry.readiness()
    assert ready is False and [m["id"] for m in body["missing"]] == [preload.id]
    assert registry.readiness([first])[0] is False


def test_bit_rot_in_the_cache_is_downloaded_again(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """A model found in the cache is checked against the checksums recorded when it was
    written; a file whose bytes changed on disk is fetched again, never served."""
    index, shards = write_model(http_server.root / "llama", shards=2, kib=300)
    url = http_server.url_for("llama/model.safetensors.index.json")
    cache = tmp_path / "cache"
    with running(cache, "--model", url) as daemon:
        daemon.wait_ready()
        assert daemon.stop() == 0
    data = _entry(cache, http_server.url_for(f"llama/{shards[0].name}")) / "data"
    rotten = bytearray(data.read_bytes())
    rotten[-100] ^= 0xFF
    data.chmod(0o644)
    data.write_bytes(bytes(rotten))

    http_server.reset_counters()
    with running(cache, "--model", url) as daemon:
        daemon.wait_ready()
        assert daemon.stop() == 0
    assert "changed on disk" in daemon.output()
    assert http_server.bytes_sent > shards[0].stat().st_size, "the rotten shard came again"
    _check_final_files(cache, {http_server.url_for(f"llama/{p.name}"): p for p in [index, *shards]})
