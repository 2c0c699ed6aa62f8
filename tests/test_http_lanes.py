"""Receive lanes (``HttpOptions.receive_lanes``): range bodies received on threads of their
own, each with its own event loop, against real local servers.

Which thread received the bytes is observed, not mocked: a profile hook (``sys.setprofile``
and ``threading.setprofile``) notes the thread of every call of the connection's
``buffer_updated``, the callback the event loop calls with each chunk it received into
the tensor. Every load is compared bit for bit with the safetensors library, and every
fault is run with one lane and with two, which must behave alike.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from aioloader import (
    ClosedError,
    HttpOptions,
    ObjectChangedError,
    ReadError,
    load_model,
)
from aioloader.runtime.threads import lane_of
from aioloader.settings.options import LoadOptions
from aioloader.sources.http.connection import Connection
from aioloader.sources.http.rules import PROBE_SIZE
from aioloader.sources.stores import Stores, locate

from .helpers import assert_matches_files
from .loop_clock import loop_clock
from .servers import FaultyHttpServer, MotoS3Server
from .test_http import FAST, NAME, big_tensors, pass_probe, poll, write_big
from .test_http_framing import RawServer, head
from .test_source_scope import _certificates

_RECEIVED = Connection.buffer_updated.__code__


def receive_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if lane_of(t.name) == "receive")


class Receipts:
    """Bytes each thread received through a connection (``buffer_updated`` calls)."""

    def __init__(self) -> None:
        self.bytes: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is _RECEIVED:
            with self._lock:
                self.bytes[threading.current_thread().name] += frame.f_locals["nbytes"]


@contextmanager
def receipts() -> Iterator[Receipts]:
    """Watch this thread and every thread started meanwhile."""
    seen = Receipts()
    before = sys.getprofile()
    sys.setprofile(seen)
    threading.setprofile(seen)
    try:
        yield seen
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(before)


# -- where the bytes are received --------------------------------------------------------


@pytest.mark.parametrize("lanes", [2, 4])
async def test_a_load_is_received_on_the_lanes_bit_for_bit(
    http_server: FaultyHttpServer, lanes: int
) -> None:
    path = write_big(http_server.root, count=24)
    with receipts() as seen:
        got = await load_model(http_server.url_for(NAME), chunk_size="256KiB", receive_lanes=lanes)
    assert_matches_files(got, path)
    assert receive_threads() == [], "lanes left running after the load"
    main = threading.current_thread().name
    # The probe goes through aiohttp; every range body after it came through a lane.
    assert seen.bytes[main] == 0, seen.bytes
    assert set(seen.bytes) == {f"aioloader-receive_{i}" for i in range(lanes)}, seen.bytes
    assert sum(seen.bytes.values()) >= path.stat().st_size - PROBE_SIZE


async def test_an_s3_load_is_signed_on_the_loop_and_received_on_the_lanes(
    s3_env: MotoS3Server, tmp_path: Path
) -> None:
    bucket = f"aiol-{uuid.uuid4().hex[:16]}"
    path = write_big(tmp_path, count=8)
    s3_env.upload(bucket, "", path)
    with receipts() as seen:
        got = await load_model(f"s3://{bucket}/{NAME}", chunk_size="256KiB", receive_lanes=2)
    assert_matches_files(got, path)
    assert seen.bytes[threading.current_thread().name] == 0, seen.bytes
    assert set(seen.bytes) == {"aioloader-receive_0", "aioloader-receive_1"}, seen.bytes
    assert receive_threads() == []


async def test_one_lane_receives_on_the_callers_loop(http_server: FaultyHttpServer) -> None:
    """The default: no thread, the caller's loop receives (and the hook sees it there)."""
    path = write_big(http_server.root, count=8)
    with receipts() as seen:
        got = await load_model(http_server.url_for(NAME), chunk_size="256KiB")
    assert_matches_files(got, path)
    assert list(seen.bytes) == [threading.current_thread().name], seen.bytes
    assert seen.bytes[threading.current_thread().name] >= path.stat().st_size - PROBE_SIZE


def test_https_lanes_share_the_callers_tls_settings(tmp_path: Path) -> None:
    """Over TLS, each lane connects with the trust the caller's process has (a child with
    SSL_CERT_FILE naming a test CA: aiohttp reads it once, at import)."""
    ca, context = _certificates(tmp_path)
    root = tmp_path / "www"
    path = write_big(root, count=8)
    child = textwrap.dedent(
        """
        import asyncio, sys
        import torch
        from safetensors.torch import load_file
        from aioloader import load_model
        got = asyncio.run(load_model(sys.argv[1], chunk_size="256KiB", receive_lanes=2))
        want = load_file(sys.argv[2])
        assert set(got) == set(want)
        for name, tensor in want.items():
            raw = tensor.reshape(-1).view(torch.uint8)
            assert got[name].reshape(-1).view(torch.uint8).equal(raw), name
        print("same", len(want))
        """
    )
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "no_proxy")}
    env.update(SSL_CERT_FILE=str(ca), NO_PROXY="127.0.0.1")
    with FaultyHttpServer(root, ssl_context=context) as server:
        url = server.url_for(NAME)
        assert url.startswith("https://")
        done = subprocess.run(
            [sys.executable, "-c", child, url, str(path)],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["same", str(len(big_tensors(count=8)))]
        assert len(server.gets(NAME)) > 1


# -- lying servers: as with one lane ------------------------------------------------------


async def _ranges_and_outcome(
    server: FaultyHttpServer, lanes: int, inject: str, options: HttpOptions
) -> tuple[list[str | None], str]:
    """The GETs a load made and how it ended, with ``inject`` aimed past the probe."""
    server.clear_faults()
    server.reset_counters()
    pass_probe(server)
    if inject == "reset":
        server.reset_after(NAME, 10_000)
    elif inject == "short":
        server.short_body(NAME)
    elif inject == "stall":
        server.stall(NAME, 2.0, after_bytes=5_000)
    elif inject == "500":
        server.status(NAME, 500)
    elif inject == "gzip":
        server.encode(NAME, "gzip")
    elif inject == "always-stall":
        server.stall(NAME, 5.0, after_bytes=1_000, count=100)
    elif inject == "always-500":
        server.status(NAME, 500, count=100)
    elif inject == "trickle":
        server.trickle(NAME, bytes_per_second=50, count=100)
    elif inject == "changed":
        server.change_after(NAME, 1)
    url = server.url_for(NAME)
    try:
        got = await load_model(
            url, concurrency=1, chunk_size="1MiB", http=options, receive_lanes=lanes
        )
    except ReadError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    except ObjectChangedError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    else:
        assert_matches_files(got, server.root / NAME)
        outcome = "loaded"
    # Each "changed" run names the version it opened (an ETag), each trickle what came
    # in how long: the rest must be alike.
    outcome = re.sub(r'"[^"]*"', '"ETag"', outcome)
    outcome = re.sub(r"\d+ bytes in [\d.]+ s", "N bytes in T s", outcome)
    # A trickled request is resumed after the bytes that came, as many as the clock let
    # in (14 in one run, 18 in another): the resumed start differs, the retries do not.
    ranges = [r.range for r in server.gets(NAME)]
    if inject == "trickle":
        ranges = [re.sub(r"=(\d+)-", _resumed, r or "") for r in ranges]
    return ranges, outcome


def _resumed(start: re.Match[str]) -> str:
    """``=N-`` as it is where ``N`` starts a planned range (whole pages), else ``=resumed-``."""
    return start.group(0) if int(start.group(1)) % 4096 == 0 else "=resumed-"


@pytest.mark.parametrize(
    "inject",
    ["reset", "short", "stall", "500", "gzip", "always-stall", "always-500", "trickle", "changed"],
)
async def test_a_lying_server_gets_the_same_retries_and_errors(
    http_server: FaultyHttpServer, inject: str
) -> None:
    write_big(http_server.root, count=8)
    options = HttpOptions(max_attempts=2, backoff=0.01, backoff_max=0.05, stall_timeout=0.3)
    if inject == "trickle":
        options = HttpOptions(
            max_attempts=2, backoff=0.01, backoff_max=0.05, min_speed=10_000, speed_window=0.3
        )
    one = await _ranges_and_outcome(http_server, 1, inject, options)
    two = await _ranges_and_outcome(http_server, 2, inject, options)
    assert two == one
    ranges, outcome = one
    expected = {
        "always-stall": "ReadTimeoutError: ",
        "always-500": "ReadError: ",
        "trickle": "ReadTimeoutError: ",
        "changed": "ObjectChangedError: ",
    }.get(inject, "loaded")
    assert outcome.startswith(expected), outcome
    # The probe, the range GET the fault hit and (but for a changed file) another one.
    assert len(ranges) >= (2 if inject == "changed" else 3), ranges
    assert receive_threads() == []


def _other_start(size: int) -> Any:
    def quirk(first: int, last: int, body: bytes) -> bytes:
        return head(first + 1, last, size, f"Content-Length: {len(body)}") + body

    return quirk


def _other_etag(size: int) -> Any:
    def quirk(first: int, last: int, body: bytes) -> bytes:
        answer = head(first, last, size, f"Content-Length: {len(body)}")
        return answer.replace(b'"v1"', b'"v2"') + body

    return quirk


@pytest.mark.parametrize("quirk", [_other_start, _other_etag], ids=["range", "etag"])
async def test_what_accept_raises_in_a_lane_reaches_the_caller_unchanged(
    tmp_path: Path, quirk: Any
) -> None:
    """A 206 of another range, or of another ETag: check_version raises in the lane's
    ``accept``, and the caller gets that very error, as with one lane."""
    path = write_big(tmp_path, count=8)
    data = path.read_bytes()
    errors: list[ObjectChangedError] = []
    async with RawServer(data, quirk(len(data))) as server:
        for lanes in (1, 2):
            with pytest.raises(ObjectChangedError) as info:
                await load_model(
                    server.url, chunk_size="1MiB", http=FAST, receive_lanes=lanes, concurrency=1
                )
            errors.append(info.value)
    assert str(errors[0]) == str(errors[1]) and "changed during the load" in str(errors[0])
    files = [Path(frame.filename).name for frame in traceback.extract_tb(errors[1].__traceback__)]
    assert "lanes.py" in files and "rules.py" in files  # raised in rules, came through a lane
    assert "lanes.py" not in [
        Path(frame.filename).name for frame in traceback.extract_tb(errors[0].__traceback__)
    ]


# -- cancellation and close ---------------------------------------------------------------


async def test_a_cancelled_read_writes_nothing_after_it_returns(
    http_server: FaultyHttpServer,
) -> None:
    """Cancelled while the server trickles the body: once the cancellation returns, the
    buffer may be reused, so no byte of the transfer lands in it any more. (Whether the
    lane would still write, had the caller not waited, is a race; five tries.)"""
    tries = 5
    (http_server.root / NAME).write_bytes(b"\x55" * (PROBE_SIZE + 1_000_000))
    url = http_server.url_for(NAME)
    stores = Stores(LoadOptions.build(receive_lanes=2))
    try:
        blob = await stores.source(locate(url)).open(url)
        http_server.trickle(NAME, bytes_per_second=1_000_000, count=tries)
        for attempt in range(tries):
            buffer = bytearray(b"\xaa" * 1_000_000)
            reading = asyncio.create_task(blob.read_into(PROBE_SIZE, [memoryview(buffer)]))
            arrived = buffer.count  # awaited at once: this try's buffer
            assert await poll(lambda: arrived(0x55) >= 50, seconds=10), arrived(0x55)  # noqa: B023
            assert receive_threads() == ["aioloader-receive_0", "aioloader-receive_1"]
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            snapshot = bytes(buffer)
            await asyncio.sleep(0.5 if attempt == tries - 1 else 0.1)
            assert bytes(buffer) == snapshot, "bytes landed after the cancellation returned"
            assert 50 <= snapshot.count(0x55) < len(buffer)
            # Its connection was dropped, not kept for another request: the server's
            # handler ends once its client has gone.
            assert await poll(lambda: http_server.in_flight == 0)
        await blob.aclose()
    finally:
        await stores.aclose()
    assert receive_threads() == []


async def test_close_with_transfers_in_flight_ends_every_lane(
    http_server: FaultyHttpServer,
) -> None:
    (http_server.root / NAME).write_bytes(os.urandom(PROBE_SIZE + 400_000))
    url = http_server.url_for(NAME)
    stores = Stores(LoadOptions.build(receive_lanes=3, stall_timeout=30.0))
    try:
        blob = await stores.source(locate(url)).open(url)
        http_server.stall(NAME, 20.0, after_bytes=1_000, count=4)
        buffers = [bytearray(100_000) for _ in range(4)]
        reads = [
            asyncio.create_task(blob.read_into(PROBE_SIZE + i * 100_000, [memoryview(b)]))
            for i, b in enumerate(buffers)
        ]
        assert await poll(lambda: http_server.in_flight == 4, seconds=10)
        assert len(receive_threads()) == 3
    finally:
        started = time.monotonic()
        await stores.aclose()
    assert time.monotonic() - started < 5.0, "the close waited for the stalled transfers"
    assert receive_threads() == [], "lanes left running after the close"
    for outcome in await asyncio.gather(*reads, return_exceptions=True):
        assert isinstance(outcome, ClosedError), outcome
    await blob.aclose()
    assert await poll(lambda: http_server.in_flight == 0)


async def test_a_closed_transport_starts_no_lanes(http_server: FaultyHttpServer) -> None:
    """A read after the close is refused; it does not start lanes nobody would close."""
    (http_server.root / NAME).write_bytes(os.urandom(PROBE_SIZE + 100_000))
    url = http_server.url_for(NAME)
    stores = Stores(LoadOptions.build(receive_lanes=2))
    try:
        blob = await stores.source(locate(url)).open(url)
    finally:
        await stores.aclose()
    with pytest.raises(ClosedError):
        await blob.read_into(PROBE_SIZE, [memoryview(bytearray(1000))])
    await blob.aclose()
    assert receive_threads() == []
    assert len(http_server.gets(NAME)) == 1  # the probe only


# -- the caller's loop --------------------------------------------------------------------


async def test_the_loop_stays_responsive_while_lanes_receive(
    http_server: FaultyHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's loop only dispatches: no callback holds it long, it reads no body
    (a handful of socket reads, the header's, against hundreds when it receives the
    128 MiB itself), and its callbacks take less CPU time than when it receives. The
    CPU time alone was compared before, at under 0.6 of one lane's: a quarter to a third
    as a rule, but 0.49 on a quiet machine once and over 0.6 in a two-worker run, since
    the rest of a load's loop work (about 12 ms: plan, header, tensors) is the same either
    way and one lane's receive gets cheaper the larger the reads a busy machine lets
    pile up."""
    path = write_big(http_server.root, count=512)
    spent, reads = {}, {}
    for lanes in (1, 2):
        gc.collect()
        with loop_clock(monkeypatch) as clock:
            url = http_server.url_for(NAME)
            got = await load_model(url, chunk_size="4MiB", receive_lanes=lanes)
        spent[lanes], reads[lanes] = clock.spent, clock.reads
        print(lanes, f"{clock.spent * 1000:.1f} ms in all, {clock.reads} reads;", clock.describe())
        assert_matches_files(got, path)
        del got
    assert clock.callbacks > 5, "the loop must have run during the load"
    assert clock.worst < 0.050, clock.describe()
    assert reads[1] >= 100 and reads[2] <= 16, reads
    assert spent[2] < spent[1], spent
