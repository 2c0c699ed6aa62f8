"""Opening a model: find its files, open each, read and validate its header.

The first step of a load, and all of an inspection (``aioloader inspect``). The files
of a URL (a file, a folder, an index or a list) are found by layout.py; each is opened
and its header read and parsed (safetensors.py), ``concurrency`` at a time; the
headers are then checked against each other and against the index (``check_layout``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from ..errors import FormatError, HeaderError, NotFoundError
from ..format.safetensors import (
    PREFIX_SIZE,
    FileHeader,
    TensorInfo,
    parse_header,
    parse_header_length,
)
from ..runtime.resource import AsyncResource
from ..runtime.tasks import gather
from ..runtime.threads import Lanes, run_blocking
from ..sources.base import Blob, Source, aclose_all
from ..sources.layout import ModelLayout, resolve_layout

__all__ = ["OpenModel", "check_layout", "load_headers", "open_model"]

# One read at the start of each file usually holds the whole header.
_HEADER_PROBE = 64 * 1024
# Headers above this size are parsed off the event loop.
_PARSE_INLINE = 256 * 1024


async def _read_header(blob: Blob, lane: Executor) -> FileHeader:
    first = await blob.read_bytes(0, min(blob.size, _HEADER_PROBE))
    length = parse_header_length(first, blob.url, blob.size)
    end = PREFIX_SIZE + length
    raw = first[PREFIX_SIZE:end]
    if len(first) < end:
        raw += await blob.read_bytes(len(first), end - len(first))
    if len(raw) != length:
        raise HeaderError(f"{blob.url}: file ended inside its {length}-byte header")
    if length > _PARSE_INLINE:
        return await run_blocking(lane, lambda: parse_header(raw, blob.url, blob.size))
    return parse_header(raw, blob.url, blob.size)


async def load_headers(
    source: Source, layout: ModelLayout, concurrency: int, lane: Executor
) -> tuple[list[Blob], list[FileHeader]]:
    """Open every file of ``layout`` and parse its header, ``concurrency`` at a time
    (long headers in ``lane``).

    On error every opened file is closed again before the error propagates.
    """
    limiter = asyncio.Semaphore(concurrency)
    blobs: list[Blob | None] = [None] * len(layout.files)
    headers: list[FileHeader | None] = [None] * len(layout.files)

    async def one(i: int, url: str) -> None:
        async with limiter:
            try:
                blobs[i] = await source.open(url)
            except NotFoundError as exc:
                if layout.index is None:
                    raise
                raise NotFoundError(
                    f"{layout.index} names shard {url}, which does not exist; download "
                    "the complete model (every shard the index lists)"
                ) from exc
            headers[i] = await _read_header(blobs[i], lane)  # type: ignore[arg-type]

    try:
        await gather(one(i, url) for i, url in enumerate(layout.files))
    except BaseException:
        await aclose_all(b for b in blobs if b is not None)
        raise
    return [b for b in blobs if b is not None], [h for h in headers if h is not None]


@dataclass
class OpenModel(AsyncResource):
    """A model whose files are open and whose headers are read and validated.

    Use as ``async with await open_model(...) as model``; closing closes every file.
    """

    layout: ModelLayout
    blobs: list[Blob]
    headers: list[FileHeader]

    async def aclose(self) -> None:
        await aclose_all(self.blobs)


async def open_model(source: Source, url: str | Sequence[str], lanes: Lanes) -> OpenModel:
    """Find the files of ``url`` (a file, a folder, an index or a list), open each and read
    its header (``lanes.concurrency`` at a time, long headers parsed in ``lanes.compute``):
    the first step of a load, and all of an inspection."""
    layout = await resolve_layout(source, url)
    blobs, headers = await load_headers(source, layout, lanes.concurrency, lanes.compute)
    return OpenModel(layout, blobs, headers)


def check_layout(layout: ModelLayout, headers: Sequence[FileHeader]) -> dict[str, TensorInfo]:
    """Every tensor once across shards, and where the index says it is."""
    found: dict[str, TensorInfo] = {}
    where: dict[str, str] = {}
    for header in headers:
        for tensor in header.tensors:
            if tensor.name in found:
                raise FormatError(
                    f"tensor {tensor.name!r} appears in both {where[tensor.name]} and "
                    f"{header.url}; shards must not repeat tensors"
                )
            found[tensor.name] = tensor
            where[tensor.name] = header.url
    if layout.weight_map is not None:
        for name, url in layout.weight_map.items():
            if where.get(name) != url:
                actual = f"is in {where[name]}" if name in where else "is in no shard"
                raise FormatError(
                    f"{layout.index} maps tensor {name!r} to {url}, but it {actual}; the "
                    "index and the shards come from different versions: download them again"
                )
    return found
