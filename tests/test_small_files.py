"""Small whole files through aiofiles in a named lane (aioloader/runtime/small_files.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from aioloader.errors import (
    AccessDeniedError,
    CacheError,
    FormatError,
    NotFoundError,
    SourceError,
)
from aioloader.runtime.small_files import (
    read_bytes,
    read_json,
    read_text,
    write_bytes_atomic,
    write_json_atomic,
)
from aioloader.runtime.threads import Lane, lane_of


async def test_json_round_trip(tmp_path: Path) -> None:
    with Lane("small", 1) as lane:
        await write_json_atomic(tmp_path / "meta.json", {"b": [1, 2], "a": "x"}, lane)
        assert await read_json(tmp_path / "meta.json", lane) == {"a": "x", "b": [1, 2]}
        assert await read_text(tmp_path / "meta.json", lane) == '{"a": "x", "b": [1, 2]}'
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]  # no temporary left


async def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with Lane("small", 1) as lane, pytest.raises(NotFoundError, match=r"absent\.json"):
        await read_json(tmp_path / "absent.json", lane)


async def test_bad_json_is_a_format_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"weight_map": ')
    (tmp_path / "twice.json").write_text('{"a": 1, "a": 2}')
    (tmp_path / "latin.txt").write_bytes(b"\xff\xfe")
    with Lane("small", 1) as lane:
        with pytest.raises(FormatError, match=r"index\.json is not valid JSON"):
            await read_json(tmp_path / "index.json", lane)
        with pytest.raises(FormatError, match="twice"):
            await read_json(tmp_path / "twice.json", lane)
        with pytest.raises(FormatError, match="not UTF-8"):
            await read_text(tmp_path / "latin.txt", lane)


async def test_a_folder_or_a_pipe_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.json")  # an open for reading would wait for a writer
    with Lane("small", 1) as lane:
        with pytest.raises(SourceError, match=r"pipe\.json is not a regular file"):
            await read_json(tmp_path / "pipe.json", lane)
        with pytest.raises(SourceError, match="is a directory"):
            await read_bytes(tmp_path, lane)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to any folder")
async def test_an_unwritable_folder_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "meta.json").write_text('{"old": true}')
    folder.chmod(0o500)
    try:
        with Lane("small", 1) as lane, pytest.raises(AccessDeniedError, match=r"meta\.json"):
            await write_json_atomic(folder / "meta.json", {"new": True}, lane)
    finally:
        folder.chmod(0o700)
    assert json.loads((folder / "meta.json").read_text()) == {"old": True}


async def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with Lane("small", 1) as lane, pytest.raises(NotFoundError, match="its folder"):
        await write_json_atomic(tmp_path / "no" / "meta.json", {}, lane)


async def test_a_folder_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with Lane("small", 1) as lane, pytest.raises(CacheError, match=r"file/meta\.json"):
        await write_json_atomic(tmp_path / "file" / "meta.json", {}, lane)


def test_a_crash_before_the_rename_leaves_the_old_file(tmp_path: Path) -> None:
    # A process that dies once the new bytes are written and synced, before the rename.
    target = tmp_path / "meta.json"
    target.write_text('{"version": 1}')
    child = f"""
import asyncio, os

def die(*args, **kwargs):
    os._exit(9)

os.replace = die  # before aiofiles wraps it
from aioloader.runtime.small_files import write_json_atomic
from aioloader.runtime.threads import Lane

async def main():
    with Lane("small", 1) as lane:
        await write_json_atomic({str(target)!r}, {{"version": 2}}, lane)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert json.loads(target.read_text()) == {"version": 1}
    left = [p for p in tmp_path.iterdir() if p != target]
    assert [p.name.startswith(".meta.json.") and p.name.endswith(".tmp") for p in left] == [True]
    assert json.loads(left[0].read_text()) == {"version": 2}  # whole, but not under its name


async def test_a_failed_rename_removes_the_temporary(tmp_path: Path) -> None:
    (tmp_path / "meta.json").mkdir()  # a file cannot be renamed over a folder
    with Lane("small", 1) as lane, pytest.raises(CacheError, match=r"writing .*meta\.json"):
        await write_bytes_atomic(tmp_path / "meta.json", b"{}", lane)
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]


async def test_the_work_runs_in_the_named_lane(tmp_path: Path) -> None:
    before = {t.name for t in threading.enumerate()}
    with Lane("small", 1) as lane:
        await write_json_atomic(tmp_path / "meta.json", {"a": 1}, lane)
        assert await read_json(tmp_path / "meta.json", lane) == {"a": 1}
        started = {t.name for t in threading.enumerate()} - before
        # Only the lane's thread: no event loop default executor ("asyncio_0").
        assert started == {"aioloader-small_0"}, started
        assert lane_of("aioloader-small_0") == "small"
