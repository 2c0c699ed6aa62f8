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
  one after the other over one connection into ``/dev/null`` (in
  ``model-http-parallel``, ``--lanes`` of them at once, see below).
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
``aioloader``, ``s5cmd`` and ``runai`` over S3. ``small-warm`` is a one-file model
of 87 MB (all-MiniLM-L6-v2's size) in the page cache: at that size what a load
costs regardless of its bytes (threads, headers, allocation, first touch of fresh
memory) shows next to its throughput. The "1st tensor s" column is the median time
from the start of a load to its first usable tensor (aioloader and runai stream
tensors; safetensors' first is its first clone). When both ran, the results end
with each tool's fixed cost per load: ``small-warm``'s median time less the time
its bytes take at the tool's median rate on ``model-warm``.

``model-cache`` measures the node-local cache (``aioloader.cache``):
the model over HTTP by its index URL, loaded three ways side by side, each with
``aioloader.load_model``:

* ``cold-remote`` -- ``cache_dir=False``: streamed from nginx, no cache;
* ``warm-cache``  -- ``cache_dir`` a cache filled once before the timed runs (by
  an untimed worker running ``ModelCache(dir).fetch(url)``) and read again
  before each run so that it is in the page cache, as on a node whose daemon
  preloaded the model: the load reads the local copy (after asking nginx for
  each file's size and ETag);
* ``populate``    -- ``cache_dir`` a fresh, empty folder per run: a cold load
  that writes the cache as it streams, the cost of teeing. Its time ends when
  the tensors are out; the entries' commit (hash, fsync, rename) runs after, in
  the background, and the worker exits only once it is done, so it never
  overlaps the next run.

Its cache folders are made in a temporary folder in ``--out`` and removed at
the end. Its headline is ``warm-cache / cold-remote``.

``model-http-parallel`` (on request only: ``--scenarios model-http-parallel``) is
``model-http`` with every tool receiving on ``--lanes N`` cores (default: the CPUs
this process may use, at least 2; printed with the run's settings and in the table's
title), for when one core receiving is the bottleneck:

* ``aioloader`` -- ``load_model`` of the index URL with
  ``HttpOptions(receive_lanes=N)``: range bodies received on N threads, each with an
  event loop and connections of its own;
* ``curl``      -- N ``curl`` processes at once: the files' bytes, end to end, cut
  into N contiguous runs of about equal length, each fetched by one process as
  ``--range`` requests (one per file it touches, in turn, over one connection). Its
  time ends with the last process; its bytes are the sum of their
  ``%{size_download}``, its CPU their total. Their aggregate is the ceiling.

Its scenario kind is ``http-parallel``: a name is its dataset, a dash, and a kind
from ``scenarios.KIND_TOOLS``, matched whole (``kind_of``), never split at its last dash.

Why it is built this way
------------------------
* Every run is a fresh subprocess (``--worker TOOL PATH``), so the peak RSS
  is that tool's alone and no tool inherits another's allocator state.
* torch and the tool's own modules are imported before the clock starts;
  importing torch takes seconds and is not load time.
* The VMs this runs on hand freed memory back to their host, and memory
  touched for the first time then fills at 0.4-1.3 GB/s. Each worker therefore
  touches and frees a buffer the size of the data as the last thing before the
  clock starts, identically for every tool, and resets its peak-RSS counter
  after. Where the VM reports free memory to the host at once (the machine
  lines say so), this helps only what a load allocates in its first fraction
  of a second: refilled at once 3 GiB filled at 6.9-7.9 GB/s, after 0.5 s at
  3.7, after 2 s at 1.4. How fast the buffer filled is printed with every run
  ("fresh memory"): runs that differ there are not comparable.
* ``--reuse-memory`` takes the host's supply out of the comparison instead:
  every worker runs under jemalloc set to keep what is freed backed and mapped
  (``LD_PRELOAD``, Debian's libjemalloc2, installed with apt-get when missing)
  and does one untimed load by the same tool before the timed one, which then
  fills memory its process has already touched, as a server that loads a
  second model does. Each run prints its page faults: a few hundred, against
  one per huge page filled otherwise. populate's warm-up writes a cache folder
  of its own, committed before the clock starts and deleted after the timed
  run. Tools that load in a child process (curl, s5cmd, fio) gain nothing from
  it; the rows to read in this mode are those of in-process loaders.
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
    python scripts/bench.py --scenarios model-cache   # only cold remote vs the local cache
    python scripts/bench.py --scenarios model-cache --reuse-memory --repeat 6   # no fresh memory
    python scripts/bench.py --scenarios model-http-parallel --lanes 2   # receiving on 2 cores

Test data is generated once into ``--out`` (default ``bench-data/``, ignored by
git) and reused while its files have the expected sizes.

Layout
------
``config`` (units and settings), ``scenarios`` (the names of tools and scenarios),
``data`` (the test data), ``tools/`` (one module per family of tools), ``worker`` (one
timed load), ``pagecache`` (warm and cold), ``runner`` (a scenario's runs), ``stats``
and ``report`` (the numbers and the tables), ``machine`` (what it runs on), ``nginx``
(the server of the remote scenarios), ``cli`` (the command line). ``scripts/bench.py``
runs ``cli.main``, and so does ``python -m scripts.bench`` from the repository root.
"""

from __future__ import annotations

from .cli import main
from .config import FILL_BLOCK
from .data import Dataset, index_json, is_complete, model_dataset, write_safetensors

# What scripts/gpu_check.py uses (``import bench`` with scripts/ on sys.path), and main.
__all__ = [
    "FILL_BLOCK",
    "Dataset",
    "index_json",
    "is_complete",
    "main",
    "model_dataset",
    "write_safetensors",
]
