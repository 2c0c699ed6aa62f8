"""HTTP(S) loads against a real local server (tests/servers.py), faults included.

Every load is compared bit for bit with the safetensors library. Faults are one-shot and
hit GETs in arrival order, so a zero-second ``stall`` registered first is a way to let the
probe (the first GET of a file, ``bytes=0-262143``) through and aim the next fault at the
first range GET after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aioloader import (
    AccessDeniedError,
    ConfigError,
    HttpOptions,
    Loader,
    NotFoundError,
    ObjectChangedError,
    ReadError,
    ReadTimeoutError,
    SourceError,
    load_model,
)
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_matches_files, assert_same, random_tensors, write_file, write_sharded
from .servers import FaultyHttpServer

# Quick retries, so that a test with faults takes well under a second.
FAST = HttpOptions(backoff=0.01, backoff_max=0.05, stall_timeout=0.3)
NAME = "m.safetensors"


def big_tensors(count: int = 16, numel: int = 64 * 1024, seed: int = 0) -> dict[str, torch.Tensor]:
    """``count`` tensors of ``numel`` float32 (256 KiB each by default), plus small ones."""
    gen = torch.Generator().manual_seed(seed)
    out = random_tensors(seed=seed, count=6)
    for i in range(count):
        out[f"big.{i:02d}"] = torch.randn(numel, generator=gen)
    return out


def write_big(folder: Path, name: str = NAME, **kwargs: int) -> Path:
    """A file of several MiB: far beyond the probe, so tensor bytes need range GETs."""
    return write_file(folder / name, big_tensors(**kwargs))


def parse_range(header: str | None) -> tuple[int, int]:
    """``bytes=a-b`` -> (a, b) inclusive."""
    assert header is not None and header.startswith("bytes="), header
    first, _, last = header[len("bytes=") :].partition("-")
    return int(first), int(last)


def pass_probe(server: FaultyHttpServer, path: str = NAME) -> None:
    """Let the next GET of ``path`` (the probe) through untouched; later faults hit after it."""
    server.stall(path, 0.0)


async def poll(condition: Callable[[], bool], seconds: float = 2.0) -> bool:
    """Wait until ``condition`` holds (server-thread state, which no event signals)."""
    for _ in range(int(seconds / 0.001)):
        if condition():
            return True
        await asyncio.sleep(0.001)
    return condition()


# -- what gets loaded -------------------------------------------------------------------


async def test_single_file(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root)
    got = await load_model(http_server.url_for(NAME), chunk_size="1MiB")
    assert_matches_files(got, path)
    gets = http_server.gets(NAME)
    assert parse_range(gets[0].range) == (0, PROBE_SIZE - 1)
    assert all(r.range is not None for r in gets)  # never the whole file in one GET


async def test_index_url_fetches_shards_relative_to_it(http_server: FaultyHttpServer) -> None:
    folder = http_server.root / "org" / "model"
    write_sharded(folder, big_tensors(count=6), shards=3)
    got = await load_model(http_server.url_for("org/model/model.safetensors.index.json"))
    shards = sorted(folder.glob("*.safetensors"))
    assert_matches_files(got, *shards)
    paths = {r.path for r in http_server.requests}
    assert paths == {"org/model/model.safetensors.index.json"} | {
        f"org/model/{s.name}" for s in shards
    }


async def test_a_folder_url_is_read_as_a_model_folder(http_server: FaultyHttpServer) -> None:
    """HTTP cannot list a folder: ``.../model/`` means its index, else model.safetensors."""
    index = write_sharded(http_server.root / "sharded", random_tensors(seed=3), shards=3)
    shards = sorted(index.parent.glob("*.safetensors"))
    assert_matches_files(await load_model(http_server.url_for("sharded") + "/"), *shards)
    single = write_file(http_server.root / "single" / "model.safetensors", random_tensors(seed=4))
    assert_matches_files(await load_model(http_server.url_for("single") + "/"), single)

    (http_server.root / "empty").mkdir()
    with pytest.raises(NotFoundError, match=r"neither model\.safetensors\.index\.json nor"):
        await load_model(http_server.url_for("empty") + "/")


async def test_list_of_shard_urls(http_server: FaultyHttpServer) -> None:
    write_sharded(http_server.root, big_tensors(count=6), shards=3)
    shards = sorted(http_server.root.glob("*.safetensors"))
    got = await load_model([http_server.url_for(s.name) for s in shards])
    assert_matches_files(got, *shards)
    assert "model.safetensors.index.json" not in {r.path for r in http_server.requests}


async def test_selection_reads_only_selected_bytes(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=32)  # 8 MiB
    size = path.stat().st_size
    wanted = ["big.20", "layer.2.weight"]
    got = await load_model(http_server.url_for(NAME), tensors=wanted, chunk_size="64KiB")
    assert sorted(got) == sorted(wanted)
    reference = load_file(str(path))
    assert_same(got, {n: reference[n] for n in wanted})
    # The probe (the header and what follows it), then the selected bytes (widened to
    # 4 KiB boundaries), nothing else.
    selected = sum(reference[n].numel() * reference[n].element_size() for n in wanted)
    assert http_server.bytes_sent <= PROBE_SIZE + selected + 2 * 4096 * len(wanted)
    assert http_server.bytes_sent < size / 10
    for record in http_server.gets(NAME)[1:]:
        first, last = parse_range(record.range)
        assert first >= PROBE_SIZE - 1 and last - first < 64 * 1024


@pytest.mark.parametrize("concurrency", [1, 3, 8])
async def test_concurrency_bounds_requests_in_flight(
    http_server: FaultyHttpServer, concurrency: int
) -> None:
    path = write_big(http_server.root, count=24)  # 6 MiB in 64 KiB chunks: ~96 range GETs
    # Every GET lingers a little, so the readers really overlap.
    http_server.stall(None, 0.005, after_bytes=1, count=10_000)
    got = await load_model(http_server.url_for(NAME), concurrency=concurrency, chunk_size="64KiB")
    assert_matches_files(got, path)
    assert len(http_server.gets(NAME)) > 90
    assert http_server.max_concurrent <= concurrency
    if concurrency > 1:
        assert http_server.max_concurrent > 1


async def test_redirect_followed(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=4)
    http_server.redirect("old/name.safetensors", NAME)
    got = await load_model(http_server.url_for("old/name.safetensors"), chunk_size="256KiB")
    assert_matches_files(got, path)
    # Only the probe goes through the redirect; the ranges go to where it pointed.
    assert len(http_server.gets("old/name.safetensors")) == 1
    assert len(http_server.gets(NAME)) > 2


async def test_redirect_loop_is_a_source_error(http_server: FaultyHttpServer) -> None:
    http_server.redirect("a.safetensors", "b.safetensors")
    http_server.redirect("b.safetensors", "a.safetensors")
    url = http_server.url_for("a.safetensors")
    with pytest.raises(SourceError) as info:
        await load_model(url, http=FAST)
    assert url in str(info.value) and "redirects" in str(info.value)
    assert len(http_server.requests) == 11  # the first request and 10 redirects, once


async def test_authorization_header(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=4)
    url = http_server.url_for(NAME)
    token = "Bearer tok-5ecret-771"
    http_server.require_header("Authorization", token)
    got = await load_model(url, headers={"Authorization": token}, chunk_size="256KiB")
    assert_matches_files(got, path)
    assert all(h.get("Authorization") == token for h in http_server.request_headers)

    with pytest.raises(AccessDeniedError) as info:
        await load_model(url)
    assert url in str(info.value) and "401" in str(info.value)
    assert "without credentials" in str(info.value)

    with pytest.raises(AccessDeniedError) as info:
        await load_model(url, headers={"Authorization": "Bearer wrong-5ecret-993"})
    message = str(info.value)
    assert url in message and "with the configured headers" in message
    assert "5ecret" not in message


async def test_headers_not_sent_to_another_host(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    other_root = tmp_path / "other"
    path = write_big(other_root, count=4)
    with FaultyHttpServer(other_root) as other:
        http_server.redirect_all_to(other.url)
        got = await load_model(
            http_server.url_for(NAME),
            headers={"Authorization": "Bearer tok", "X-Api-Key": "key"},
            chunk_size="256KiB",
        )
        assert_matches_files(got, path)
        assert len(other.gets(NAME)) > 2
        for headers in other.request_headers:
            assert "Authorization" not in headers and "X-Api-Key" not in headers, headers
    assert all(h.get("X-Api-Key") == "key" for h in http_server.request_headers)


async def test_proxy_settings_are_read_once_per_host(
    http_server: FaultyHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading them walks the whole environment (milliseconds in a pod with thousands
    of variables): once per host, not once for each of a load's range GETs."""
    path = write_big(http_server.root)
    calls: list[str] = []
    real = urllib.request.getproxies

    def counted() -> dict[str, str]:
        calls.append(traceback.extract_stack(limit=2)[0].filename)
        return real()

    monkeypatch.setattr(urllib.request, "getproxies", counted)
    got = await load_model(http_server.url_for(NAME), chunk_size="64KiB", concurrency=2)
    assert_matches_files(got, path)
    assert len(http_server.gets(NAME)) > 30
    ours = [c for c in calls if "aioloader" in Path(c).parts]
    assert len(ours) == 1, calls


# -- faults -----------------------------------------------------------------------------


def _inject(server: FaultyHttpServer, fault: str) -> int:
    """Register ``fault`` once for the next GET; returns the body bytes it lets through."""
    if fault == "reset":
        server.reset_after(NAME, 10_000)
        return 10_000
    if fault == "short":
        server.short_body(NAME)
        return -1  # half of what was asked
    if fault == "stall":
        server.stall(NAME, 2.0, after_bytes=5_000)
        return 5_000
    if fault == "500":
        server.status(NAME, 500)
    elif fault == "503":
        server.status(NAME, 503, retry_after=1)
    elif fault == "429":
        server.status(NAME, 429, retry_after=0)
    return 0


@pytest.mark.parametrize("fault", ["reset", "short", "stall", "500", "503", "429"])
async def test_fault_recovers_bit_identically(http_server: FaultyHttpServer, fault: str) -> None:
    path = write_big(http_server.root, count=8)
    _inject(http_server, fault)  # the probe
    pass_probe(http_server)  # its retry
    through = _inject(http_server, fault)  # the first range GET after it
    started = time.monotonic()
    got = await load_model(http_server.url_for(NAME), concurrency=1, chunk_size="1MiB", http=FAST)
    assert_matches_files(got, path)
    if fault == "503":  # Retry-After: 1 is capped by backoff_max, for every request
        assert time.monotonic() - started < 0.9

    ranges = [parse_range(r.range) for r in http_server.gets(NAME)]
    assert ranges[0] == ranges[1] == (0, PROBE_SIZE - 1)  # a probe starts over
    (first, last), retry = ranges[2], ranges[3]
    if through < 0:
        through = (last - first + 1) // 2
    # The retry resumes right after the last byte that arrived.
    assert retry == (first + through, last)


async def test_reset_twice_in_one_range(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=8)
    pass_probe(http_server)
    http_server.reset_after(NAME, 70_000)
    http_server.reset_after(NAME, 1)
    got = await load_model(http_server.url_for(NAME), concurrency=1, chunk_size="1MiB", http=FAST)
    assert_matches_files(got, path)
    ranges = [parse_range(r.range) for r in http_server.gets(NAME)]
    (first, last) = ranges[1]
    assert ranges[2:4] == [(first + 70_000, last), (first + 70_001, last)]


async def test_retry_after_is_honoured(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=2)
    pass_probe(http_server)
    http_server.status(NAME, 503, retry_after=1)
    started = time.monotonic()
    got = await load_model(
        http_server.url_for(NAME), http=HttpOptions(backoff=0.01, backoff_max=5.0)
    )
    assert_matches_files(got, path)
    assert time.monotonic() - started >= 0.9


async def test_gives_up_after_max_attempts(http_server: FaultyHttpServer) -> None:
    write_big(http_server.root, count=4)
    url = http_server.url_for(NAME)
    pass_probe(http_server)
    http_server.status(NAME, 500, count=100)
    options = HttpOptions(max_attempts=3, backoff=0.01, backoff_max=0.05)
    async with Loader(concurrency=1, chunk_size="256KiB", http=options) as loader:
        with pytest.raises(ReadError) as info:
            await loader.load(url)
        assert loader.statistics().budget.used == 0
    error = info.value
    assert not isinstance(error, ReadTimeoutError)
    message = str(error)
    assert error.url == url and url in message
    assert error.start < error.end and error.end > PROBE_SIZE
    assert f"[{error.start}, {error.end})" in message
    assert "3 attempts" in message and "HTTP 500" in message
    assert "big.00" in error.tensors
    assert len(http_server.gets(NAME)) == 1 + 3


async def test_gives_up_on_the_probe(http_server: FaultyHttpServer) -> None:
    write_big(http_server.root, count=2)
    url = http_server.url_for(NAME)
    http_server.reset_after(NAME, 0, count=100)
    with pytest.raises(ReadError) as info:
        await load_model(url, http=HttpOptions(max_attempts=2, backoff=0.01, backoff_max=0.05))
    assert url in str(info.value) and f"[0, {PROBE_SIZE})" in str(info.value)


STALLING = HttpOptions(max_attempts=2, backoff=0.01, backoff_max=0.05, stall_timeout=0.2)


async def stalled_range_load(server: FaultyHttpServer) -> ReadError:
    """Load while every range GET after the probe stalls; the error raised."""
    write_big(server.root, count=4)
    pass_probe(server)
    server.stall(NAME, 5.0, after_bytes=1_000, count=100)
    started = time.monotonic()
    with pytest.raises(ReadError) as info:
        await load_model(server.url_for(NAME), concurrency=1, chunk_size="256KiB", http=STALLING)
    assert time.monotonic() - started < 2.0
    return info.value


async def test_persistent_stall_gives_up(http_server: FaultyHttpServer) -> None:
    error = await stalled_range_load(http_server)
    url = http_server.url_for(NAME)
    assert url in str(error) and f"[{error.start}, {error.end})" in str(error)
    assert "2 attempts" in str(error) and "no data for" in str(error)


async def test_persistent_stall_is_a_timeout(http_server: FaultyHttpServer) -> None:
    error = await stalled_range_load(http_server)
    assert isinstance(error, ReadTimeoutError) and isinstance(error, TimeoutError)


async def test_stall_before_headers_is_a_timeout(http_server: FaultyHttpServer) -> None:
    write_big(http_server.root, count=2)
    url = http_server.url_for(NAME)
    http_server.stall(NAME, 5.0, count=100, before_headers=True)
    with pytest.raises(ReadTimeoutError) as info:
        await load_model(url, http=STALLING)
    assert isinstance(info.value, TimeoutError)
    assert url in str(info.value) and f"[0, {PROBE_SIZE})" in str(info.value)


async def test_throttling_lowers_requests_in_flight(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=24)
    # Each GET takes a moment, so that 16 readers really pile up on the server.
    http_server.stall(None, 0.002, after_bytes=1, count=10_000)
    http_server.limit_concurrency(2, code=503, retry_after=0)
    async with Loader(concurrency=16, chunk_size="64KiB", http=FAST) as loader:
        got = await loader.load(http_server.url_for(NAME))
        stats = loader.statistics().sources["http"]
    assert_matches_files(got, path)
    assert stats.maximum == 16
    assert stats.throttled > 0
    assert stats.limit < 16
    assert stats.in_flight == 0 and stats.waiting == 0


async def test_throttling_costs_no_attempt_while_the_limit_can_fall(
    http_server: FaultyHttpServer,
) -> None:
    path = write_big(http_server.root, count=4)  # one range after the probe
    pass_probe(http_server)
    # 16 -> 8 -> 4 -> 2 -> 1 on the first four answers, then two failed attempts of three.
    http_server.status(NAME, 503, count=6, retry_after=0)
    options = HttpOptions(max_attempts=3, backoff=0.01, backoff_max=0.05)
    async with Loader(concurrency=16, chunk_size="16MiB", http=options) as loader:
        got = await loader.load(http_server.url_for(NAME))
        stats = loader.statistics().sources["http"]
    assert_matches_files(got, path)
    assert stats.throttled == 6 and stats.limit == 2
    assert len(http_server.gets(NAME)) == 1 + 6 + 1


async def test_throttled_at_one_request_gives_up(http_server: FaultyHttpServer) -> None:
    write_big(http_server.root, count=4)
    url = http_server.url_for(NAME)
    pass_probe(http_server)
    http_server.status(NAME, 503, count=100, retry_after=0)
    options = HttpOptions(max_attempts=3, backoff=0.01, backoff_max=0.05)
    with pytest.raises(ReadError) as info:
        await load_model(url, concurrency=16, chunk_size="16MiB", http=options)
    message = str(info.value)
    assert url in message and "3 of them without progress" in message and "HTTP 503" in message
    assert len(http_server.gets(NAME)) == 1 + 4 + 3  # four halvings, then three attempts


async def test_etag_change_mid_load(http_server: FaultyHttpServer) -> None:
    path = write_big(http_server.root, count=16)
    url = http_server.url_for(NAME)
    http_server.change_after(NAME, 3)  # the probe and two ranges see the first version
    reference = load_file(str(path))
    seen: dict[str, torch.Tensor] = {}
    async with Loader(concurrency=1, chunk_size="256KiB", http=FAST) as loader:
        with pytest.raises(ObjectChangedError) as info:
            async with loader.stream(url) as stream:
                async for name, tensor in stream:
                    seen[name] = tensor
        assert loader.statistics().budget.used == 0
    assert url in str(info.value)
    assert len(seen) < len(reference)
    # What was handed out before the change is the first version, never a mix.
    assert_same(seen, {n: reference[n] for n in seen})
    with pytest.raises(ObjectChangedError):
        http_server.change_after(NAME, 2)
        await load_model(url, chunk_size="256KiB", http=FAST)


async def test_server_ignoring_range(
    http_server: FaultyHttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    index = write_sharded(http_server.root, big_tensors(count=48), shards=2)  # 2 x 6 MiB
    shards = sorted(http_server.root.glob("*.safetensors"))
    size = sum(s.stat().st_size for s in shards) + index.stat().st_size
    http_server.ignore_range(None)
    caplog.set_level(logging.WARNING, logger="aioloader")
    got = await load_model(
        http_server.url_for(index.name), concurrency=4, chunk_size="64KiB", http=FAST
    )
    assert_matches_files(got, *shards)
    warnings = [r.getMessage() for r in caplog.records if r.name.split(".")[0] == "aioloader"]
    assert len(warnings) == 1 and "ignores Range" in warnings[0], warnings
    assert size // (64 * 1024) > 150  # many chunks...
    assert http_server.bytes_sent < 2 * size  # ...yet each byte was sent about once
    for shard in shards:
        assert len(http_server.gets(shard.name)) <= 3


async def test_server_ignoring_range_partial_reads_do_not_hang(
    http_server: FaultyHttpServer,
) -> None:
    """Streams left open mid-file (their tensors skipped) must not starve other files."""
    index = write_sharded(http_server.root, big_tensors(count=32), shards=2)
    shards = sorted(http_server.root.glob("*.safetensors"))
    http_server.ignore_range(None)
    wanted = ["big.00", "big.01"]  # one near the start of each shard
    async with asyncio.timeout(10):
        got = await load_model(
            http_server.url_for(index.name), tensors=wanted, concurrency=1, http=FAST
        )
    reference = {**load_file(str(shards[0])), **load_file(str(shards[1]))}
    assert_same(got, {n: reference[n] for n in wanted})


async def test_not_found(http_server: FaultyHttpServer) -> None:
    url = http_server.url_for("missing.safetensors")
    with pytest.raises(NotFoundError) as info:
        await load_model(url)
    assert url in str(info.value) and "404" in str(info.value)


async def test_missing_shard_named_by_index(http_server: FaultyHttpServer) -> None:
    write_sharded(http_server.root, big_tensors(count=3), shards=3)
    (http_server.root / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(NotFoundError) as info:
        await load_model(http_server.url_for("model.safetensors.index.json"))
    assert "model-00002-of-00003.safetensors" in str(info.value)


async def test_forbidden(http_server: FaultyHttpServer) -> None:
    write_big(http_server.root, count=2)
    url = http_server.url_for(NAME)
    http_server.status(NAME, 403)
    with pytest.raises(AccessDeniedError) as info:
        await load_model(url, http=FAST)
    assert url in str(info.value) and "403" in str(info.value)
    assert len(http_server.gets(NAME)) == 1  # not retried


async def test_folder_url_without_the_usual_names(http_server: FaultyHttpServer) -> None:
    """A folder URL whose files have other names: the error says what was looked for."""
    write_big(http_server.root, count=2)
    with pytest.raises(SourceError) as info:
        await load_model(http_server.url + "/")
    assert "cannot be listed" in str(info.value) and "index.json" in str(info.value)


@pytest.mark.parametrize("after_gets", [1, 2, 5, 20])
async def test_cancel_mid_load(http_server: FaultyHttpServer, after_gets: int) -> None:
    write_big(http_server.root, count=24)
    http_server.stall(None, 0.01, after_bytes=1000, count=10_000)
    async with Loader(concurrency=4, chunk_size="64KiB", memory_limit="1MiB") as loader:
        task = asyncio.create_task(loader.load(http_server.url_for(NAME)))
        await poll(lambda: len(http_server.gets()) >= after_gets or task.done())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = loader.statistics()
        assert stats.budget.used == 0 and stats.budget.waiting == 0
        assert stats.streams == 0
        limiter = loader.statistics().sources["http"]
        assert limiter.in_flight == 0 and limiter.waiting == 0
    # The server's handlers end once their clients are gone.
    assert await poll(lambda: http_server.in_flight == 0)


def test_under_uvloop(http_server: FaultyHttpServer) -> None:
    """The direct range client also runs on uvloop (which the CLI and daemon use)."""
    uvloop = pytest.importorskip("uvloop")
    path = write_big(http_server.root, count=8)
    got = uvloop.run(load_model(http_server.url_for(NAME), chunk_size="64KiB", concurrency=4))
    assert_matches_files(got, path)


# -- hostile and broken networks ---------------------------------------------------------


async def test_steady_progress_is_not_given_up(http_server: FaultyHttpServer) -> None:
    """A link that drops every connection, but delivers bytes each time, still finishes:
    only attempts without progress use up max_attempts."""
    path = write_big(http_server.root, count=8)
    http_server.reset_after(NAME, 100_000, count=10_000, past=1)  # every range GET
    got = await load_model(http_server.url_for(NAME), concurrency=2, chunk_size="1MiB", http=FAST)
    assert_matches_files(got, path)
    assert len(http_server.gets(NAME)) > 6 * 2, "ranges needed more than 6 attempts each"


@pytest.mark.parametrize("cached", [False, True])
async def test_compressed_answer_is_refused_then_retried(
    http_server: FaultyHttpServer, tmp_path: Path, cached: bool
) -> None:
    """A body sent with Content-Encoding: gzip is not the file's bytes: none of it is
    kept (not in the tensor, not in the cache), and the range is asked for again."""
    path = write_big(http_server.root, count=4)
    pass_probe(http_server)
    http_server.encode(NAME, "gzip", count=2)
    url = http_server.url_for(NAME)
    cache = tmp_path / "cache" if cached else None
    got = await load_model(url, concurrency=1, chunk_size="1MiB", http=FAST, cache_dir=cache)
    assert_matches_files(got, path)
    if cached:  # the second load is served by the cache: it must hold the right bytes
        http_server.reset_counters()
        assert_matches_files(await load_model(url, http=FAST, cache_dir=cache), path)
        assert [parse_range(r.range)[0] for r in http_server.gets(NAME)] == [0], "from cache"


async def test_compressed_answers_fail_the_load_clearly(http_server: FaultyHttpServer) -> None:
    write_big(http_server.root, count=2)
    url = http_server.url_for(NAME)
    http_server.encode(NAME, "gzip", count=100)
    with pytest.raises(ReadError) as info:
        await load_model(url, http=HttpOptions(max_attempts=2, backoff=0.01, backoff_max=0.05))
    assert url in str(info.value) and "Content-Encoding: gzip" in str(info.value)


async def test_trickle_is_dropped_as_too_slow(http_server: FaultyHttpServer) -> None:
    """An upstream sending a byte now and then never trips the stall timeout; the
    minimum speed catches it, and such attempts use up max_attempts."""
    write_big(http_server.root, count=4)
    pass_probe(http_server)
    http_server.trickle(NAME, bytes_per_second=50, count=100)
    options = HttpOptions(
        max_attempts=2, backoff=0.01, backoff_max=0.05, stall_timeout=5.0,
        min_speed=10_000, speed_window=0.3,
    )  # fmt: skip
    started = time.monotonic()
    async with asyncio.timeout(20):
        with pytest.raises(ReadTimeoutError) as info:
            await load_model(http_server.url_for(NAME), concurrency=1, http=options)
    assert time.monotonic() - started < 5.0
    assert "min_speed" in str(info.value) and "2 attempts" in str(info.value)


async def test_deadline_bounds_one_range(http_server: FaultyHttpServer) -> None:
    write_big(http_server.root, count=4)
    pass_probe(http_server)
    http_server.stall(NAME, 5.0, after_bytes=1_000, count=100)
    options = HttpOptions(stall_timeout=30.0, deadline=0.5)
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError) as info:
        await load_model(http_server.url_for(NAME), concurrency=1, http=options)
    assert time.monotonic() - started < 3.0
    assert "deadline of 0.5 s" in str(info.value)


@pytest.mark.parametrize("target", ["file:///etc", "s3://bucket"])
async def test_redirect_to_another_scheme_is_refused(
    http_server: FaultyHttpServer, target: str
) -> None:
    url = http_server.url_for(NAME)
    http_server.redirect_all_to(target)
    with pytest.raises(SourceError) as info:
        await load_model(url, http=FAST)
    message = str(info.value)
    assert url in message and f"{target}/{NAME}" in message and "http://" in message


async def test_url_policy_sees_every_url(http_server: FaultyHttpServer) -> None:
    """The URL asked for, each shard, and each redirect target pass the policy first."""
    write_sharded(http_server.root, random_tensors(count=6), shards=2)
    http_server.redirect("old.index.json", "model.safetensors.index.json")
    seen: list[str] = []

    def policy(url: str) -> None:
        seen.append(url)
        if url.endswith("00002-of-00002.safetensors"):
            raise AccessDeniedError(f"{url} is not allowed")

    with pytest.raises(AccessDeniedError, match="00002-of-00002"):
        await load_model(http_server.url_for("old.index.json"), http=HttpOptions(url_policy=policy))
    assert seen[:2] == [
        http_server.url_for("old.index.json"),
        http_server.url_for("model.safetensors.index.json"),
    ]
    assert http_server.url_for("model-00001-of-00002.safetensors") in seen
    assert not http_server.gets("model-00002-of-00002.safetensors"), "refused before sending"


async def test_a_presigned_url_with_an_invalid_port_is_named_without_its_signature() -> None:
    url = "https://127.0.0.1:99999/m.safetensors?X-Amz-Credential=AKIAXX&X-Amz-Signature=f00d"
    with pytest.raises(ConfigError, match="port") as info:
        await load_model(url)
    shown = "".join(traceback.format_exception(info.value))
    assert "f00d" not in shown and "AKIAXX" not in shown
    assert "127.0.0.1:99999/m.safetensors" in str(info.value)


async def test_a_redirect_to_an_invalid_port_is_named_without_its_signature(
    http_server: FaultyHttpServer,
) -> None:
    write_file(http_server.root / NAME, random_tensors())
    http_server.redirect(NAME, "http://127.0.0.1:70000/m.safetensors?sig=f00d")
    url = http_server.url_for(NAME)
    with pytest.raises(SourceError, match="port") as info:
        await load_model(url, http=FAST)
    shown = "".join(traceback.format_exception(info.value))
    assert "f00d" not in shown and url in str(info.value)
