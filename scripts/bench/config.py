"""Units, paths and the settings of the tools, the workers and the server."""

from __future__ import annotations

from pathlib import Path

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
GB = 10**9

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the workers run: the entry point, which imports this package.
ENTRY = REPO_ROOT / "scripts" / "bench.py"

# Set in the workers' environment by --reuse-memory (with a retaining jemalloc).
REUSE_MEMORY = "BENCH_REUSE_MEMORY"
# Set in the workers' environment of the parallel scenarios: --lanes, the cores that
# receive at once (aioloader's receive_lanes, or that many curl processes).
LANES = "BENCH_LANES"

SHARDS = 4
ONE_TENSOR_SHAPE = (32768, 32768)  # BF16: 2 GiB
SMALL_BYTES = 87 * 1000**2  # all-MiniLM-L6-v2's size: a load's fixed cost shows
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
