"""HTTP framing from a server that writes exact bytes: interim answers, ambiguous lengths.

The direct range client (aioloader/sources/http/connection.py) reads the socket itself, so what a
server may write there is tested with a raw socket server (``RawServer``) rather than
aiohttp, which would normalise the very bytes under test. Every load that succeeds is
compared bit for bit with the safetensors library.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from aioloader import (
    HttpOptions,
    LoaderError,
    OutOfMemoryError,
    ReadError,
    SourceError,
    load_model,
)
from aioloader.sources.http.connection import WireError, content_length
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_matches_files, some_big, write_file
from .socket_server import SocketServer

Quirk = Callable[[int, int, bytes], bytes]
"""(first byte, last byte, body) of one range GET -> the exact bytes to answer with."""

FAST = HttpOptions(backoff=0.01, backoff_max=0.02, max_attempts=2)


def head(first: int, last: int, size: int, *extra: str) -> bytes:
    lines = [
        "HTTP/1.1 206 Partial Content",
        f"Content-Range: bytes {first}-{last}/{size}",
        'ETag: "v1"',
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class RawServer(SocketServer):
    """Serves ``data`` to range GETs on 127.0.0.1; a GET from byte ``from_byte`` on (by
    default past the probe: one the direct client makes) is answered with what ``quirk``
    writes.

    Use as ``async with RawServer(data, quirk) as server:``; ``claimed_size`` is the
    size its answers give for the file.
    """

    def __init__(
        self,
        data: bytes,
        quirk: Quirk | None = None,
        claimed_size: int = 0,
        from_byte: int = PROBE_SIZE,
    ) -> None:
        super().__init__()
        self.data = data
        self.quirk = quirk
        self.from_byte = from_byte
        self.claimed_size = claimed_size or len(data)
        self.ranges: list[tuple[int, int]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/model.safetensors"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            match = re.search(r"(?im)^range: bytes=(\d+)-(\d+)\r$", request)
            assert match is not None, request
            first = int(match.group(1))
            last = min(int(match.group(2)), len(self.data) - 1)
            self.ranges.append((first, last))
            body = self.data[first : last + 1]
            if self.quirk is not None and first >= self.from_byte:
                answer = self.quirk(first, last, body)
            else:
                length = f"Content-Length: {len(body)}"
                answer = head(first, last, self.claimed_size, length) + body
            writer.write(answer)
            await writer.drain()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_file(tmp_path / "model.safetensors", some_big(7))


async def _load_through(model: Path, quirk: Quirk) -> dict[str, object]:
    async with RawServer(model.read_bytes(), quirk) as server:
        got = await load_model(server.url, chunk_size="1MiB", http=FAST)
        assert any(first >= PROBE_SIZE for first, _ in server.ranges)
        return got


async def test_early_hints_before_the_206_are_skipped(model: Path) -> None:
    def quirk(first: int, last: int, body: bytes) -> bytes:
        hints = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        more = b"HTTP/1.1 100 Continue\r\n\r\n"
        length = f"Content-Length: {len(body)}"
        return hints + more + head(first, last, model.stat().st_size, length) + body

    assert_matches_files(await _load_through(model, quirk), model)


async def test_a_list_of_identical_content_lengths_is_one_length(model: Path) -> None:
    size = model.stat().st_size

    def quirk(first: int, last: int, body: bytes) -> bytes:
        n = len(body)
        if first % 2:  # the same value on two lines
            return head(first, last, size, f"Content-Length: {n}", f"Content-Length: {n}") + body
        return head(first, last, size, f"Content-Length: {n}, {n}") + body

    assert_matches_files(await _load_through(model, quirk), model)


@pytest.mark.parametrize("two_lines", [False, True])
async def test_differing_content_lengths_are_a_named_error(model: Path, two_lines: bool) -> None:
    size = model.stat().st_size

    def quirk(first: int, last: int, body: bytes) -> bytes:
        n = len(body)
        lengths = (
            (f"Content-Length: {n}", f"Content-Length: {n + 5}")
            if two_lines
            else (f"Content-Length: {n}, {n + 5}",)
        )
        return head(first, last, size, *lengths) + body + b"\0" * 5

    with pytest.raises(ReadError, match="conflicting Content-Length") as info:
        await _load_through(model, quirk)
    assert "model.safetensors bytes [" in str(info.value)


async def test_chunked_with_a_content_length_is_refused_not_read_as_data(model: Path) -> None:
    """RFC 9112 6.3: Transfer-Encoding overrides Content-Length, and the message ought to
    be handled as an error. The Content-Length here is the range's own length, so a
    client that believed it would put the chunk framing into the tensor."""
    size = model.stat().st_size

    def quirk(first: int, last: int, body: bytes) -> bytes:
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        extra = ("Transfer-Encoding: chunked", f"Content-Length: {len(body)}")
        return head(first, last, size, *extra) + chunked

    with pytest.raises(ReadError, match="both Transfer-Encoding and Content-Length"):
        await _load_through(model, quirk)


async def test_chunked_alone_is_read_through_the_fallback(model: Path) -> None:
    size = model.stat().st_size

    def quirk(first: int, last: int, body: bytes) -> bytes:
        half = len(body) // 2
        chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            half, body[:half], len(body) - half, body[half:],
        )  # fmt: skip
        return head(first, last, size, "Transfer-Encoding: chunked") + chunked

    assert_matches_files(await _load_through(model, quirk), model)


async def test_framing_aiohttp_refuses_on_the_probe_is_a_named_error(model: Path) -> None:
    """The probe goes through aiohttp, whose parser refuses what the direct client does
    (and a list of lengths besides): a ReadError naming the file, not aiohttp's own."""
    size = model.stat().st_size

    def quirk(first: int, last: int, body: bytes) -> bytes:
        n = len(body)
        return head(first, last, size, f"Content-Length: {n}", f"Content-Length: {n + 1}") + body

    async with RawServer(model.read_bytes(), quirk, from_byte=0) as server:
        with pytest.raises(ReadError, match="Content-Length") as info:
            await load_model(server.url, http=FAST)
    assert server.url in str(info.value)


def test_content_length_values() -> None:
    assert content_length(None) is None
    assert content_length("0") == 0
    assert content_length(" 65536 ,65536, 65536") == 65536
    for bad in ("", "-1", "+5", "1e3", "0x10", "٣", "9" * 20, "5,", "5, 6", "5 5"):
        with pytest.raises(WireError):
            content_length(bad)


async def test_a_size_of_a_tebibyte_is_refused_before_anything_is_allocated(
    tmp_path: Path,
) -> None:
    """An index file the server says is 1 TiB: its whole body would be read into memory."""
    index = b'{"weight_map": {}}'.ljust(PROBE_SIZE + 10, b" ")
    async with RawServer(index, claimed_size=1 << 40) as server:
        url = server.url.replace("model.safetensors", "model.safetensors.index.json")
        with pytest.raises(SourceError, match="1099511627776 bytes") as info:
            await load_model(url, http=FAST)
    assert not isinstance(info.value, MemoryError)
    assert url in str(info.value)


def _claiming(nbytes: int) -> tuple[bytes, int]:
    """A safetensors file whose header claims one F32 tensor of ``nbytes``: its first
    bytes (past the probe) and the size its server gives for it."""
    entry = {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}
    header = json.dumps({"w": entry}).encode()
    header = header.ljust(-(-len(header) // 8) * 8, b" ")
    head = struct.pack("<Q", len(header)) + header
    return head.ljust(PROBE_SIZE + 4096, b"\0"), len(head) + nbytes


@pytest.mark.parametrize("nbytes", [1 << 40, 1 << 50], ids=["TiB", "PiB"])
async def test_a_tensor_larger_than_memory_is_refused_before_anything_is_allocated(
    nbytes: int,
) -> None:
    """A tebibyte raised NumPy's MemoryError, naming neither the file nor the tensor; a
    pebibyte held the event loop while its reads were planned, for minutes."""
    data, size = _claiming(nbytes)
    async with RawServer(data, claimed_size=size) as server:
        with pytest.raises(OutOfMemoryError) as info:
            await load_model(server.url, http=FAST)
    message = str(info.value)
    assert server.url in message and f"tensor 'w' holds {nbytes} bytes" in message
    assert "more than this process may use" in message
    assert isinstance(info.value, LoaderError) and isinstance(info.value, MemoryError)
