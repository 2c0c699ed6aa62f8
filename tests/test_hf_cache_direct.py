"""The hub cache's blobs are written with ``O_DIRECT`` where the file system allows
(sinks/hf/blob_writer.py): committed bit for bit, and not left in the page cache."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import pytest

from aioloader import load_model
from aioloader.sinks.hf.cache_writes import wait_hf_cache

from .helpers import assert_matches_files
from .hub_server import LocalHub
from .test_hf_cache import REPO, _repo
from .test_prefault import resident

pytest.importorskip("huggingface_hub")


def _direct_writes_work(folder: Path) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / "probe", os.O_CREAT | os.O_WRONLY | os.O_DIRECT)
    except (OSError, AttributeError):
        return False
    os.close(fd)
    (folder / "probe").unlink()
    return True


def _resident_share(path: Path) -> float:
    with open(path, "rb") as file:
        area = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)  # nothing read yet
        try:
            pages = resident(area)
        finally:
            area.close()
    return sum(pages) / len(pages)


async def test_the_blobs_are_written_past_the_page_cache(hub: LocalHub, tmp_path: Path) -> None:
    ours = tmp_path / "hf-cache"
    if not _direct_writes_work(ours):
        pytest.skip("this file system refuses O_DIRECT")
    _, folder = _repo(tmp_path, hub)
    got = await load_model(f"hf://{REPO}")
    await wait_hf_cache()
    assert_matches_files(got, *sorted(folder.glob("*.safetensors")))
    blobs = [
        blob
        for blob in (ours / "models--org--model" / "blobs").iterdir()
        if blob.stat().st_size >= 1 << 20
    ]
    assert blobs, "the weights' blobs are in the cache"
    for blob in blobs:  # before anything reads them
        share = _resident_share(blob)
        assert share < 0.5, f"{blob.name}: {share:.0%} of its pages in the page cache"
    for blob in blobs:
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
