"""The daemon shares the node: a bandwidth cap for all its downloads, and priorities.

The real ``aioloader serve`` against the local HTTP server: the cap is measured as
bytes over time at the server, the priorities as the order the server sees the
requests in. The pure parts (the bucket, the priority queue) are checked in
process on the side, with hostile values for every new flag, variable and field.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aioloader import ConfigError
from aioloader.daemon.bandwidth import Bandwidth, TokenBucket
from aioloader.daemon.priority import PriorityGate

from .daemon_helpers import running, single_file, write_model
from .s3_server import MotoS3Server
from .servers import FaultyHttpServer

pytest.importorskip("prometheus_client")

MiB = 1 << 20
PROBE = 256 * 1024  # opening a file reads this much, before any pacing (rules.PROBE_SIZE)


class _Sampler:
    """The server's body bytes sent, sampled every 20 ms in a thread."""

    def __init__(self, server: FaultyHttpServer) -> None:
        self.server = server
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test sampler")

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append((time.monotonic(), self.server.bytes_sent))

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        # The last bytes may have gone out after the last tick (the sampler wakes every
        # 20 ms): one sample more, once the work is done, so that none is missed.
        self.samples.append((time.monotonic(), self.server.bytes_sent))


def test_the_cap_holds_at_the_server(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    source = single_file(http_server.root / "big.safetensors", kib=4096)
    url = http_server.url_for("big.safetensors")
    size = source.stat().st_size
    with (
        running(tmp_path / "cache", "--max-bandwidth", "1MiB/s") as daemon,
        _Sampler(http_server) as sampler,
    ):
        assert daemon.post({"url": url, "id": "big"})[0] == 202
        record = daemon.wait_status("big", "ready", seconds=120)
        m = daemon.metrics()
    assert Path(record["path"]).read_bytes() == source.read_bytes()
    assert m["aioloader_daemon_max_bandwidth_bytes_per_second"] == MiB
    assert m["aioloader_daemon_throttled_bytes_total"] >= 3 * MiB
    assert m["aioloader_daemon_throttle_wait_seconds_total"] > 1

    moving = [(t, n) for t, n in sampler.samples if n > 0]
    first, last = moving[0], next(s for s in sampler.samples if s[1] >= size)
    # 4 MiB at 1 MiB/s: a quarter second of burst comes free, the rest (the probe too) paced.
    assert last[0] - first[0] >= 3.0, (first, last)
    # Over any span of a second or more, no more than the cap plus one burst and the probe.
    for i, (t0, n0) in enumerate(moving):
        for t1, n1 in moving[i + 1 :]:
            if t1 - t0 >= 1.0:
                # (a read granted just before the span may still be on its way)
                assert n1 - n0 <= MiB * (t1 - t0) * 1.05 + PROBE + MiB // 2 + 64 * 1024, (
                    t0, t1, n1 - n0,
                )  # fmt: skip


def test_the_probes_are_paced_too(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    """Opening a file reads its first 256 KiB: a model of many shards must not send those
    all at once, in a burst of a few MiB, before the cap applies to the ranges."""
    _, shards = write_model(http_server.root / "many", shards=16, kib=320)
    url = http_server.url_for("many/model.safetensors.index.json")
    size = sum(p.stat().st_size for p in shards)
    with (
        running(tmp_path / "cache", "--max-bandwidth", "1MiB/s") as daemon,
        _Sampler(http_server) as sampler,
    ):
        assert daemon.post({"url": url, "id": "many"})[0] == 202
        record = daemon.wait_status("many", "ready", seconds=120)
    links = sorted(Path(record["path"]).parent.glob("*.safetensors"))
    assert [p.read_bytes() for p in links] == [p.read_bytes() for p in shards]
    moving = [(t, n) for t, n in sampler.samples if n > 0]
    assert moving[-1][1] >= size
    # From the first byte on, over any span of half a second or more: the cap, one
    # bucket (a quarter second of it), and one read granted just before the span.
    for i, (t0, n0) in enumerate(moving):
        for t1, n1 in moving[i + 1 :]:
            if t1 - t0 >= 0.5:
                assert n1 - n0 <= MiB * (t1 - t0) * 1.05 + MiB // 4 + PROBE + 64 * 1024, (
                    t0, t1, n1 - n0,
                )  # fmt: skip


def test_no_cap_by_default(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    single_file(http_server.root / "m.safetensors", kib=512)
    with running(tmp_path / "cache") as daemon:
        assert daemon.post({"url": http_server.url_for("m.safetensors"), "id": "m"})[0] == 202
        daemon.wait_status("m", "ready")
        m = daemon.metrics()
    assert m["aioloader_daemon_max_bandwidth_bytes_per_second"] == 0
    assert m["aioloader_daemon_throttled_bytes_total"] == 0
    assert m["aioloader_daemon_throttle_wait_seconds_total"] == 0


def _first_gets(server: FaultyHttpServer, names: list[str]) -> list[str]:
    """``names`` in the order the server first saw a GET of each."""
    seen: list[str] = []
    for request in server.gets():
        name = request.path.rsplit("/", 1)[-1].removesuffix(".safetensors")
        if name in names and name not in seen:
            seen.append(name)
    return seen


def test_preloads_start_highest_priority_first(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    names = ["low", "high", "middle"]
    for i, name in enumerate(names):
        single_file(http_server.root / f"{name}.safetensors", kib=256, seed=i)
    urls = {name: http_server.url_for(f"{name}.safetensors") for name in names}
    args = ["--max-downloads", "1"]
    for name, priority in zip(names, (-3, 7, 2), strict=True):
        args += ["--model", f"{urls[name]} priority={priority}"]
    with running(tmp_path / "cache", *args) as daemon:
        daemon.wait_ready(seconds=60)
        listed = {m["url"]: m["priority"] for m in daemon.get("/v1/models")[1]["models"]}
    assert _first_gets(http_server, names) == ["high", "middle", "low"]
    assert listed == {urls["low"]: -3, urls["high"]: 7, urls["middle"]: 2}


def test_queued_models_start_by_priority(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    names = ["blocker", "a", "b", "c"]
    for i, name in enumerate(names):
        single_file(http_server.root / f"{name}.safetensors", kib=128, seed=i)
    urls = {name: http_server.url_for(f"{name}.safetensors") for name in names}
    # The blocker holds the only slot while the others queue behind it.
    http_server.stall("blocker.safetensors", 2.0, before_headers=True)
    with running(tmp_path / "cache", "--max-downloads", "1") as daemon:
        assert daemon.post({"url": urls["blocker"], "id": "blocker"})[0] == 202
        daemon.wait_status("blocker", "downloading")
        for name, priority in (("a", 1), ("b", 3), ("c", 2)):
            status, body = daemon.post({"url": urls[name], "id": name, "priority": priority})
            assert (status, body["priority"], body["status"]) == (202, priority, "queued")
        # Raising a queued model's priority moves it up the line.
        status, body = daemon.post({"url": urls["a"], "priority": 9})
        assert (status, body["id"], body["priority"]) == (200, "a", 9)
        status, ready = daemon.get("/ready")
        assert {m["id"]: m["priority"] for m in ready["pending"]} == {
            "blocker": 0, "a": 9, "b": 3, "c": 2
        }  # fmt: skip
        for name in names:
            daemon.wait_status(name, "ready", seconds=60)
    assert _first_gets(http_server, names) == ["blocker", "a", "b", "c"]


def test_bandwidth_goes_to_the_higher_priority_first(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    for i, name in enumerate(("low", "high")):
        single_file(http_server.root / f"{name}.safetensors", kib=1536, seed=i)
    low, high = (http_server.url_for(f"{n}.safetensors") for n in ("low", "high"))
    args = ["--max-bandwidth", "2MiB/s", "--max-downloads", "2"]
    with running(tmp_path / "cache", *args, "--model", low, "--model", f"{high} priority=1") as d:
        d.wait_ready(seconds=60)
    gets = http_server.gets()
    probe = f"bytes=0-{PROBE - 1}"
    last_high = max(i for i, r in enumerate(gets) if r.path.endswith("high.safetensors"))
    low_reads = [
        i for i, r in enumerate(gets) if r.path.endswith("low.safetensors") and r.range != probe
    ]
    # Both start at once; the low one's reads wait while the high one wants bytes (one
    # read of the low one may get the bucket's first burst before the high one asks).
    assert len([i for i in low_reads if i < last_high]) <= 1, gets
    assert len(low_reads) >= 2


# Hostile values, each refused at startup (exit 2) with the flag or variable named.
_BAD_BANDWIDTH = [
    "nan", "inf", "-1MB/s", "1e9", "lots", "100TiB/s", "1", "1KB/s", "5MB/s/s", "MB/s",
    "1.5.0MB/s", " ",
]  # fmt: skip
_BAD_PRIORITY = ["abc", "1.5", "nan", "99999999999", "", "True", "1e3"]


def _start(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOADER_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "aioloader", "serve", "--port", "0",
         "--cache-dir", str(tmp_path / "cache"), *args],
        capture_output=True, text=True, timeout=60, check=False, env=environ,
    )  # fmt: skip


def _hostile_cases() -> list[tuple[list[str], dict[str, str], str]]:
    """(flags, environment, the name the refusal must give) for every hostile value."""
    url = "https://models.invalid/m.safetensors"
    cases: list[tuple[list[str], dict[str, str], str]] = []
    for value in _BAD_BANDWIDTH:
        cases.append(([f"--max-bandwidth={value}"], {}, "--max-bandwidth"))
        cases.append(([], {"AIOLOADER_MAX_BANDWIDTH": value}, "AIOLOADER_MAX_BANDWIDTH"))
    for value in _BAD_PRIORITY:
        cases.append((["--model", f"{url} priority={value}"], {}, "--model"))
        cases.append(([], {"AIOLOADER_MODELS": f"{url} priority={value}"}, "AIOLOADER_MODELS"))
    cases.append((["--model", f"{url} weight=3"], {}, "--model"))
    cases.append(([], {"AIOLOADER_MODELS": f"{url} priority"}, "AIOLOADER_MODELS"))
    return cases


def test_hostile_values_are_refused_naming_the_setting(tmp_path: Path) -> None:
    import argparse

    from aioloader.daemon.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for args, env, named in _hostile_cases():
        with pytest.raises(ConfigError, match=named):
            config_from_args(parser.parse_args(args), {"HOME": str(tmp_path), **env})


def test_hostile_values_stop_the_real_daemon(tmp_path: Path) -> None:
    # One of each kind through the real process: exit 2, the setting named, no traceback.
    cases = _hostile_cases()[::5]
    assert {named for _, _, named in cases} == {
        "--max-bandwidth", "AIOLOADER_MAX_BANDWIDTH", "--model", "AIOLOADER_MODELS"
    }  # fmt: skip
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda c: _start(tmp_path, c[0], c[1]), cases))
    for (args, env, named), out in zip(cases, outs, strict=True):
        assert out.returncode == 2, (args, env, out.stderr)
        assert named in out.stderr and "Traceback" not in out.stderr, (args, env, out.stderr)


def test_good_values_are_read(tmp_path: Path) -> None:
    import argparse

    from aioloader.daemon.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    read = lambda *a, **env: config_from_args(parser.parse_args(list(a)), env)  # noqa: E731
    assert read("--max-bandwidth", "500MB/s").max_bandwidth == 500_000_000
    assert read(AIOLOADER_MAX_BANDWIDTH="2GiB/s").max_bandwidth == 2 << 30
    assert read(AIOLOADER_MAX_BANDWIDTH="1048576").max_bandwidth == MiB
    assert read("--max-bandwidth", "0", AIOLOADER_MAX_BANDWIDTH="1MiB/s").max_bandwidth == 0
    assert read(AIOLOADER_MAX_BANDWIDTH="").max_bandwidth == 0
    config = read(AIOLOADER_MODELS="s3://b/a/ priority=5, s3://b/c/,s3://b/a/ priority=1")
    assert config.models == ("s3://b/a/", "s3://b/c/")
    assert config.priorities == (("s3://b/a/", 5),)
    config = read("--model", "s3://b/x/  priority=-2")
    assert (config.models, config.priorities) == (("s3://b/x/",), (("s3://b/x/", -2),))


def test_hostile_priorities_in_the_api(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    import json

    single_file(http_server.root / "m.safetensors", kib=64)
    url = http_server.url_for("m.safetensors")
    hostile = ["5", 1.5, True, [], {}, 10**7, -(10**7), 10**100, float("nan"), float("inf")]
    with running(tmp_path / "cache") as daemon:
        for priority in hostile:
            raw = json.dumps({"url": url, "priority": priority}).encode()
            status, body = daemon.request("POST", "/v1/models", raw=raw)
            assert (status, body["error"]) == (400, "bad_priority"), (priority, body)
            assert "priority" in body["detail"]
        assert daemon.get("/v1/models")[1]["models"] == []
        # null is "not given"
        status, body = daemon.post({"url": url, "priority": None})
        assert (status, body["priority"]) == (202, 0)
        # and a model held already refuses a hostile priority too, keeping its own
        status, body = daemon.post({"url": url, "priority": "9"})
        assert (status, body["error"]) == (400, "bad_priority")
        assert daemon.get("/v1/models")[1]["models"][0]["priority"] == 0


def test_the_bucket_and_the_gate_in_process() -> None:
    bucket = TokenBucket(rate=100.0, burst=50.0, level=50.0, stamp=0.0)
    assert bucket.take(50, 0.0) and not bucket.take(1, 0.0)
    assert bucket.delay(25, 0.0) == pytest.approx(0.25)
    assert bucket.take(25, 0.25)
    assert bucket.take(500, 1.0)  # a full bucket lets a large read through, in debt
    assert bucket.delay(50, 1.0) == pytest.approx(5.0)
    with pytest.raises(ConfigError, match="max bandwidth"):
        Bandwidth(100)

    async def main() -> tuple[list[str], float]:
        gate = PriorityGate(1)
        order: list[str] = []

        async def one(name: str, priority: int) -> None:
            async with gate.slot(lambda: priority):
                order.append(name)
                await asyncio.sleep(0.01)

        async with asyncio.TaskGroup() as tg:
            for name, priority in (("first", 0), ("a", 1), ("b", 5), ("c", 5), ("d", -1)):
                tg.create_task(one(name, priority))
        # The loop stays responsive while reads wait for a 1 MiB/s cap.
        cap = Bandwidth(MiB)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        await asyncio.gather(*(cap.take(MiB // 4) for _ in range(6)))
        elapsed = time.monotonic() - started
        ticker.cancel()
        assert ticks >= 50 and cap.statistics().throttled_bytes == 5 * MiB // 4
        # Strict priority, but a read past max_wait goes next, oldest first: a high
        # priority download that keeps asking cannot hold a low one back for ever.
        cap = Bandwidth(MiB, max_wait=0.3)
        done: list[str] = []

        async def high() -> None:
            for _ in range(6):
                await cap.take(MiB // 4, lambda: 1)
                done.append("high")

        async def low() -> None:
            await cap.take(MiB // 4, lambda: -1)
            done.append("low")

        async with asyncio.TaskGroup() as tg:
            tg.create_task(high())
            tg.create_task(high())
            tg.create_task(low())
        assert len(done) == 13 and done.index("low") <= 4, done
        return order, elapsed

    order, elapsed = asyncio.run(main())
    assert order == ["first", "b", "c", "a", "d"]
    assert elapsed >= 1.2  # 1.5 MiB, of which a quarter came free


def test_a_retry_that_reads_a_stream_again_is_paced_too(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """A server that ignores Range is read as one stream; a stream that ends after 2 MiB
    of its 4 is opened again and read from its start: those 2 MiB cross the network
    again, and count against the cap as every other byte does (issue 42)."""
    source = single_file(http_server.root / "stream.safetensors", kib=4096)
    url = http_server.url_for("stream.safetensors")
    http_server.ignore_range("stream.safetensors")
    # Half the body, then a clean end: the probe takes the first (it reads 256 KiB of
    # it), the stream the second, so the daemon reads 2 MiB, then the whole file again.
    http_server.short_body("stream.safetensors", count=2)
    with running(tmp_path / "cache", "--max-bandwidth", "1MiB/s") as daemon:
        started = time.monotonic()
        assert daemon.post({"url": url, "id": "stream"})[0] == 202
        record = daemon.wait_status("stream", "ready", seconds=120)
        seconds = time.monotonic() - started
        m = daemon.metrics()
    assert Path(record["path"]).read_bytes() == source.read_bytes()
    # About 6.25 MiB read (the probe, 2 MiB, then 4), every byte taken from the cap: at
    # 1 MiB/s, 6 s past its first quarter second of burst; before, 4 MiB were taken.
    assert m["aioloader_daemon_throttled_bytes_total"] >= 5.5 * MiB
    assert seconds >= 5.0, seconds


def test_listings_count_against_the_cap(s3_env: MotoS3Server, tmp_path: Path) -> None:
    """A folder's listing (here S3's ListObjectsV2 pages, about 0.7 MiB of XML for 2000
    keys) crosses the network as the weights do, and counts against the cap (issue 42)."""
    s3_env.create_bucket("listed")
    model = single_file(tmp_path / "model.safetensors", kib=512)
    s3_env.put_object("listed", "m/model.safetensors", model.read_bytes())
    client = s3_env.client()
    for n in range(2000):
        client.put_object(Bucket="listed", Key=f"m/notes-{n:06d}-{'x' * 150}.txt", Body=b"")
    with running(tmp_path / "cache", "--max-bandwidth", "1MiB/s") as daemon:
        assert daemon.post({"url": "s3://listed/m/", "id": "listed"})[0] == 202
        record = daemon.wait_status("listed", "ready", seconds=120)
        m = daemon.metrics()
    assert (Path(record["path"]) / "model.safetensors").read_bytes() == model.read_bytes()
    # Every byte read went through the cap, the listing's pages (2000 keys of 170 bytes
    # and more) as the weights. Whether a byte also waited depends on how fast the rest
    # of the machine is: a slow listing (a busy machine) lets the bucket refill between
    # pages, and counting waits failed in CI (262 KiB waited of the 662 KiB expected).
    read = model.stat().st_size + 2000 * 170
    assert m["aioloader_daemon_capped_bytes_total"] >= read
