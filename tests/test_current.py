"""``Source.current``: a file's size and validators as the store has it now, asked
without a body where the store answers a HEAD (the swarm asks it before it follows a
peer for a file: a joining node reads no body bytes from the origin)."""

from __future__ import annotations

import uuid
from pathlib import Path

from aioloader.settings.options import LoadOptions
from aioloader.sources.base import Current
from aioloader.sources.stores import Stores, locate

from .servers import FaultyHttpServer, MotoS3Server


async def _current_and_opened(url: str) -> tuple[Current, Current]:
    stores = Stores(LoadOptions.build())
    try:
        source = stores.source(locate(url))
        now = await source.current(url)
        blob = await source.open(url)
        try:
            return now, Current(blob.size, blob.etag, blob.last_modified)
        finally:
            await blob.aclose()
    finally:
        await stores.aclose()


async def test_an_http_file_is_current_from_a_head(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    (http_server.root / "m.safetensors").write_bytes(b"x" * 300_000)
    url = http_server.url_for("m.safetensors")
    now, opened = await _current_and_opened(url)
    assert now == opened and now.size == 300_000 and now.etag
    assert http_server.requests[0].method == "HEAD"


async def test_an_s3_object_is_current_from_a_head(s3_env: MotoS3Server) -> None:
    bucket = f"current-{uuid.uuid4().hex[:8]}"
    client = s3_env.client()
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="m/a.safetensors", Body=b"y" * 70_000)
    now, opened = await _current_and_opened(f"s3://{bucket}/m/a.safetensors")
    assert now == opened and now.size == 70_000 and now.etag
