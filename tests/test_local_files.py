"""Local files that are not what they seem: not regular files, or changed while loading."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from aioloader import Loader, ObjectChangedError, SourceError, load_model

from .helpers import assert_matches_files, write_file

# Long enough that a child stuck on a FIFO is a failure, not a slow machine.
_HANG = 120


def _load_in_child(url: str) -> subprocess.CompletedProcess[str]:
    """Load ``url`` in a fresh process: a load stuck in open() cannot be cancelled, so
    only a process (killed at the timeout) can show it without hanging the test run."""
    code = (
        "import asyncio, aioloader\n"
        "try:\n"
        f"    asyncio.run(aioloader.load_model({url!r}))\n"
        "except aioloader.LoaderError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "else:\n"
        "    print('LOADED')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=_HANG, check=False
    )


@pytest.mark.parametrize("named", ["file", "folder", "symlink"])
def test_fifo_named_like_a_shard_is_refused(tmp_path: Path, named: str) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    url = {"file": fifo, "folder": tmp_path, "symlink": tmp_path / "link.safetensors"}[named]
    if named == "symlink":
        os.symlink(fifo, url)
    done = _load_in_child(str(url))
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert out.startswith("SourceError"), out
    assert "named pipe (FIFO)" in out and "regular file" in out, out
    assert str(fifo if named == "folder" else url) in out, out


async def test_fifo_is_refused_in_process(tmp_path: Path) -> None:
    """In-process too: the error comes at once, and no thread waits for a writer."""
    fifo = tmp_path / "m.safetensors"
    os.mkfifo(fifo)
    # Should a thread sit in open() (the defect), a writer releases it after a while:
    # the test then fails instead of hanging the run.
    release = threading.Timer(20, _write_to_readers, args=(fifo,))
    release.start()
    try:
        with pytest.raises(SourceError, match="named pipe"):
            await load_model(str(fifo))
    finally:
        release.cancel()
        release.join()


def _write_to_readers(fifo: Path) -> None:
    with contextlib.suppress(OSError):  # ENXIO: nobody has it open for reading
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize(
    ("target", "kind"), [("/dev/zero", "character device"), ("/dev/null", "character device")]
)
async def test_device_named_like_a_shard_is_refused(tmp_path: Path, target: str, kind: str) -> None:
    link = tmp_path / "model.safetensors"
    os.symlink(target, link)
    for url in (link, tmp_path):
        with pytest.raises(SourceError) as info:
            await load_model(str(url))
        assert kind in str(info.value) and str(link) in str(info.value), info.value


async def test_directory_named_like_a_shard_is_refused(tmp_path: Path) -> None:
    write_file(tmp_path / "a.safetensors", {"w": torch.ones(3)})
    (tmp_path / "b.safetensors").mkdir()
    with pytest.raises(SourceError) as info:
        await load_model(str(tmp_path))
    assert "b.safetensors is a directory" in str(info.value)


async def test_symlink_to_a_regular_file_loads(tmp_path: Path) -> None:
    real = write_file(tmp_path / "real" / "model.safetensors", {"w": torch.arange(5.0)})
    link = tmp_path / "model.safetensors"
    os.symlink(real, link)
    assert_matches_files(await load_model(str(link)), real)


# A file changed while it is being read.


def _many_reads(tmp_path: Path) -> Path:
    """A file that a 4 KiB read size loads in about 64 reads, with an mtime in the past:
    any write now gives it a new one, however coarse the file system's clock."""
    gen = torch.Generator().manual_seed(1)
    tensors = {f"t{i}": torch.randn(1024, generator=gen) for i in range(64)}
    path = write_file(tmp_path / "model.safetensors", tensors)
    os.utime(path, ns=(10**18, 10**18))
    return path


async def _load_changing(path: Path, change: Callable[[], None]) -> ObjectChangedError:
    """Stream ``path`` one 4 KiB read at a time and call ``change`` on the first tensor.

    ``change`` blocks the event loop, so the single reader cannot start a read while it
    runs: the first reads come from the old file, the rest from the changed one.
    """
    changed = False
    async with Loader(concurrency=1, chunk_size="4KiB") as loader:
        with pytest.raises(ObjectChangedError) as info:
            async with loader.stream(str(path)) as stream:
                async for _ in stream:
                    if not changed:
                        changed = True
                        change()
        assert changed
    message = str(info.value)
    assert str(path) in message and "changed during the load" in message, message
    return info.value


async def test_file_rewritten_in_place_by_another_process(tmp_path: Path) -> None:
    path = _many_reads(tmp_path)
    code = (
        "import sys\n"
        "with open(sys.argv[1], 'r+b') as f:\n"
        "    f.seek(-64 * 4096, 2)\n"
        "    f.write(bytes(64 * 4096))\n"
    )

    def rewrite() -> None:
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=_HANG)

    error = await _load_changing(path, rewrite)
    assert "written to" in str(error)


async def test_file_renamed_over_by_another_thread(tmp_path: Path) -> None:
    path = _many_reads(tmp_path)
    newer = write_file(tmp_path / "new" / "model.safetensors", {"other": torch.zeros(4)})

    def rename_over() -> None:
        worker = threading.Thread(target=os.replace, args=(newer, path))
        worker.start()
        worker.join()

    error = await _load_changing(path, rename_over)
    assert "replaced" in str(error)


async def test_file_grown_by_another_thread(tmp_path: Path) -> None:
    path = _many_reads(tmp_path)
    size = path.stat().st_size

    def grow() -> None:
        worker = threading.Thread(target=os.truncate, args=(path, size + 4096))
        worker.start()
        worker.join()

    error = await _load_changing(path, grow)
    assert f"from {size} to {size + 4096} bytes" in str(error)


async def test_file_removed_mid_load(tmp_path: Path) -> None:
    path = _many_reads(tmp_path)
    await _load_changing(path, path.unlink)


async def test_unchanged_file_streams_in_full(tmp_path: Path) -> None:
    """The same slow load, with nothing changed, loads every tensor bit for bit."""
    path = _many_reads(tmp_path)
    got = {}
    async with Loader(concurrency=1, chunk_size="4KiB") as loader:
        async with loader.stream(str(path)) as stream:
            async for name, tensor in stream:
                got[name] = tensor
    assert_matches_files(got, path)
