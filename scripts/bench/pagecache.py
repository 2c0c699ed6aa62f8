"""The files in the page cache, or out of it: warm and cold runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .config import MiB


def resident_bytes(paths: Sequence[Path]) -> int | None:
    """Bytes of ``paths`` in the page cache, by util-linux ``fincore``; None without it."""
    fincore = shutil.which("fincore")
    if fincore is None:
        return None
    command = [fincore, "--bytes", "--noheadings", "--raw", "--output", "RES", *map(str, paths)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return sum(int(line) for line in done.stdout.split())


def evict(paths: Sequence[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    resident = resident_bytes(paths)
    if resident is not None and resident > 0.01 * total_size(paths):
        print(f"  WARNING: {resident / MiB:.0f} MiB still cached after eviction")


def warm(paths: Sequence[Path]) -> None:
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)
    resident = resident_bytes(paths)
    if resident is not None and resident < 0.99 * total_size(paths):
        print(f"  WARNING: only {resident / MiB:.0f} MiB of the files stay cached")


def total_size(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths)
