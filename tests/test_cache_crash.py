"""A process that dies between the rename of ``data.partial`` to ``data`` and the write of
the complete ``meta.json`` (partial.py, ``complete``) leaves a verified file that the next
load or fetch takes back and checks against its journal (journal.py), downloading only
what the journal does not vouch for.

The child dies there for real: its commit threads are held while a staged load writes
every range (write-through, so all its bytes are in ``data.partial`` when it returns),
then no file of the process may grow (``RLIMIT_FSIZE`` 0, ``SIGXFSZ`` at its default),
and the commit runs: it hashes, fsyncs and renames, and is killed writing ``meta.json``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from aioloader import ModelCache, load_model
from aioloader.reads.ranges import RangeSet
from aioloader.sources.http.rules import PROBE_SIZE

from .helpers import assert_matches_files, assert_same, write_file
from .servers import FaultyHttpServer
from .test_cache import big_tensors, entry_dir, meta_of

_DIE_WRITING_META = """
import asyncio, resource, signal, sys, threading
from pathlib import Path
from aioloader import ModelCache, load_model
from aioloader.reads.ranges import RangeSet
from aioloader.sinks import commits
from aioloader.devices.staged import HostCopyEngine

url, root = sys.argv[1], sys.argv[2]
never = threading.Event()
for _ in range(4):  # both commit threads, and then some
    commits.submit(Path(root) / "elsewhere", never.wait)
asyncio.run(load_model(url, cache_dir=root, device=HostCopyEngine(), chunk_size="256KiB"))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: die, as a kill would
never.set()
asyncio.run(ModelCache(root).wait_committed())
"""


def _die_writing_meta(url: str, root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _DIE_WRITING_META, url, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGXFSZ, (done.returncode, done.stderr)


def _data_gets(server: FaultyHttpServer, name: str) -> list[str | None]:
    """The ranges of the GETs of ``name`` after its probe."""
    return [r.range for r in server.gets(name)[1:]]


@pytest.mark.parametrize("then", ["load", "fetch", "after a reboot"])
async def test_a_file_renamed_before_its_entry_was_marked_complete_is_taken_back(
    http_server: FaultyHttpServer, tmp_path: Path, then: str
) -> None:
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=16))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    _die_writing_meta(url, root)
    entry = entry_dir(root, url)
    # The state the crash left: every byte renamed into place, fsynced, journaled, and
    # an entry that does not say complete.
    assert (entry / "data").read_bytes() == path.read_bytes()
    assert not (entry / "data.partial").exists()
    assert (entry / "data.ranges").exists()
    assert meta_of(root, url)["complete"] is False
    if then == "after a reboot":
        meta = meta_of(root, url)
        meta["boot_id"] = "another boot"
        (entry / "meta.json").write_text(json.dumps(meta))

    http_server.reset_counters()
    if then == "fetch":
        fetched = await ModelCache(root).fetch(url)
        assert fetched.downloaded == 0
    else:
        assert_matches_files(await load_model(url, cache_dir=root), path)
    assert _data_gets(http_server, "m.safetensors") == []  # the probe, nothing more
    assert http_server.bytes_sent <= PROBE_SIZE
    cache = ModelCache(root)
    await cache.wait_committed()
    assert [(e.complete, e.size) for e in cache.entries()] == [(True, path.stat().st_size)]
    assert [r.status for r in await cache.verify(url)] == ["ok"]
    assert not (entry / "data.ranges").exists()


async def test_what_the_journal_does_not_hold_is_downloaded_again(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """The file taken back is trusted only as far as its journal goes: a journal that lost
    its last lines (never fsynced, so a reboot may cut it) leaves those ranges to fetch."""
    path = write_file(http_server.root / "m.safetensors", big_tensors(count=16))
    url = http_server.url_for("m.safetensors")
    root = tmp_path / "cache"
    _die_writing_meta(url, root)
    journal = entry_dir(root, url) / "data.ranges"
    lines = journal.read_text().splitlines()
    assert len(lines) > 2
    kept = lines[: len(lines) // 2]
    journal.write_text("".join(f"{line}\n" for line in kept))
    vouched = RangeSet(_span(line) for line in kept)
    lost = vouched.missing(path.stat().st_size)
    # Those bytes are not the remote's any more, so a range served from them would show.
    with open(entry_dir(root, url) / "data", "r+b") as fh:
        for start, end in lost:
            fh.seek(start)
            fh.write(bytes(end - start))

    http_server.reset_counters()
    got = await load_model(url, cache_dir=root, chunk_size="256KiB")  # reads as the child's
    assert_same(got, load_file(str(path)))
    fetched = RangeSet(_span(r) for r in _data_gets(http_server, "m.safetensors") if r)
    assert all(fetched.covers(start, end) for start, end in lost)
    # The probe, then the reads that the journal does not cover (256 KiB each).
    size = path.stat().st_size
    assert http_server.bytes_sent <= PROBE_SIZE + size - vouched.total + 2 * 256 * 1024 < size
    cache = ModelCache(root)
    await cache.wait_committed()
    assert [r.status for r in await cache.verify(url)] == ["ok"]
    assert_matches_files(await load_model(url, cache_dir=root), path)


def _span(text: str) -> tuple[int, int]:
    """``[start, end)`` of a journal line (``start end ...``) or a Range header."""
    if text.startswith("bytes="):
        first, last = text.removeprefix("bytes=").split("-")
        return int(first), int(last) + 1
    start, end = text.split()[:2]
    return int(start), int(end)
