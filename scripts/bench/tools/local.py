"""The tools that read the files on local disk; ``PREPARE`` maps each name to its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from ..config import (
    DIRECT_ALIGN,
    DIRECT_CHUNK,
    DIRECT_THREADS,
    FIO_DIRECT,
    PREADV_CHUNK,
    PREADV_THREADS,
)
from .base import Loaded, Prepared, aioloader_load, runai_load, tensor_bytes


def _prepare_aioloader(target: Path, files: list[Path]) -> Prepared:
    return aioloader_load(str(target))


def _prepare_safetensors(target: Path, files: list[Path], backend: str = "mmap") -> Prepared:
    # load_file's default backend ("mmap") returns views of a private file
    # mapping (/proc/self/maps shows the shards mapped rw-p, and what is read
    # counts as RssFile): pages are read when first touched and belong to the
    # page cache, which may drop them and read them again. That is not "in
    # memory, owned by the caller", which is what aioloader and runai deliver,
    # so every tensor is cloned into anonymous memory, the work a user who wants
    # owned tensors has to do. The "pread" backend (safetensors 0.8+) reads into
    # owned memory itself; it is the opt-in tool "safetensors-pread".
    from safetensors.torch import load_file

    def load() -> Loaded:
        tensors: dict[str, Any] = {}
        first = None
        for path in files:
            for name, tensor in load_file(str(path), backend=backend).items():
                tensors[name] = tensor.clone() if backend == "mmap" else tensor
                if first is None:
                    first = time.perf_counter()
        return Loaded(tensors, tensor_bytes(tensors), first=first)

    return load


def _prepare_runai(target: Path, files: list[Path]) -> Prepared:
    return runai_load([str(p) for p in files])


def _prepare_preadv(target: Path, files: list[Path]) -> Prepared:
    import numpy as np

    sizes = [p.stat().st_size for p in files]

    def load() -> Loaded:
        buffer = np.empty(sum(sizes), np.uint8)  # numpy asks for huge pages on big arrays
        fds = [os.open(p, os.O_RDONLY) for p in files]
        try:
            preadv_all(buffer.data, list(zip(fds, sizes, strict=True)))
        finally:
            for fd in fds:
                os.close(fd)
        return Loaded(buffer, buffer.nbytes)

    return load


def preadv_all(dest: memoryview, files: list[tuple[int, int]]) -> None:
    """Read whole files back to back into ``dest``, 8 MiB at a time, from two threads."""
    chunks = iter(_chunks(files, PREADV_CHUNK))
    lock = threading.Lock()

    def reader() -> None:
        while True:
            with lock:
                chunk = next(chunks, None)
            if chunk is None:
                return
            fd, offset, start, length = chunk
            while length:
                got = os.preadv(fd, [dest[start : start + length]], offset)
                if got == 0:
                    raise EOFError(f"file shrank while reading (fd {fd}, offset {offset})")
                offset, start, length = offset + got, start + got, length - got

    with ThreadPoolExecutor(PREADV_THREADS) as pool:
        for future in [pool.submit(reader) for _ in range(PREADV_THREADS)]:
            future.result()


def _chunks(files: list[tuple[int, int]], size: int) -> Iterator[tuple[int, int, int, int]]:
    """(fd, file offset, destination offset, length) covering each file in turn."""
    start = 0
    for fd, length in files:
        for offset in range(0, length, size):
            yield fd, offset, start + offset, min(size, length - offset)
        start += length


def _prepare_direct(target: Path, files: list[Path], huge: bool = True) -> Prepared:
    import mmap

    import numpy as np

    sizes = [p.stat().st_size for p in files]
    total = sum(map(_aligned, sizes))

    def destination() -> Any:
        if huge:  # numpy asks for huge pages on big arrays, as aioloader's host memory does
            raw = np.empty(total + DIRECT_ALIGN, np.uint8)
            skip = -raw.ctypes.data % DIRECT_ALIGN
            return raw[skip : skip + total]
        area = mmap.mmap(-1, total)
        area.madvise(mmap.MADV_NOHUGEPAGE)
        return np.frombuffer(area, np.uint8)

    def load() -> Loaded:
        buffer = destination()
        fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in files]
        try:
            direct_all(memoryview(buffer), list(zip(fds, sizes, strict=True)))
        finally:
            for fd in fds:
                os.close(fd)
        return Loaded(buffer, sum(sizes))

    return load


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to whole O_DIRECT blocks."""
    return -(-nbytes // DIRECT_ALIGN) * DIRECT_ALIGN


def direct_all(dest: memoryview, files: list[tuple[int, int]]) -> None:
    """Read whole files, each padded to 4 KiB, into ``dest`` with ``O_DIRECT`` from 16 threads.

    O_DIRECT reads whole blocks: the last one of a file comes back short, at its end.
    """
    ends = dict(files)
    chunks = list(_chunks([(fd, _aligned(size)) for fd, size in files], DIRECT_CHUNK))

    def read(chunk: tuple[int, int, int, int]) -> None:
        fd, offset, start, length = chunk
        length = min(length, ends[fd] - offset)
        while length > 0:
            got = os.preadv(fd, [dest[start : start + _aligned(length)]], offset)
            if got == 0:
                raise EOFError(f"file shrank while reading (fd {fd}, offset {offset})")
            offset, start, length = offset + got, start + got, length - got

    with ThreadPoolExecutor(DIRECT_THREADS) as pool:
        for future in [pool.submit(read, chunk) for chunk in chunks]:
            future.result()


def _prepare_fio(target: Path, files: list[Path]) -> Prepared:
    fio = shutil.which("fio")
    if fio is None:
        raise RuntimeError("fio is not installed")
    command = [
        fio,
        "--name=seqread",
        "--rw=read",
        "--bs=1M",
        "--iodepth=32",
        "--ioengine=libaio",
        f"--direct={FIO_DIRECT}",
        "--numjobs=1",
        "--file_service_type=sequential",
        "--output-format=json",
        "--filename=" + ":".join(str(p).replace(":", "\\:") for p in files),
    ]

    def load() -> Loaded:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        read = json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0]["read"]
        return Loaded(None, read["io_bytes"], read["runtime"] / 1000, in_process=False)

    return load


PREPARE: dict[str, Callable[[Path, list[Path]], Prepared]] = {
    "aioloader": _prepare_aioloader,
    "safetensors": _prepare_safetensors,
    "safetensors-pread": partial(_prepare_safetensors, backend="pread"),
    "runai": _prepare_runai,
    "preadv": _prepare_preadv,
    "fio": _prepare_fio,
    "direct": _prepare_direct,
    "direct-4k": partial(_prepare_direct, huge=False),
}
