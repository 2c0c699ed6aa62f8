"""Multi-rank loading side by side: aioloader ``group=``, runai-model-streamer's distributed
mode and fastsafetensors, all over gloo on host memory.

    .venv/bin/python scripts/dist_bench.py --ranks 2 4 --rounds 3

N spawned processes on this machine load the same model (bench-data/llama-1gib, made
by ``scripts/bench.py --size-gib 1`` when missing, read into the page cache before
every run) and must each end with every tensor. Per run: the slowest rank's wall
time (ranks start together after a barrier), the bytes all ranks read from the files
together (``rchar`` of /proc/self/io: each byte read once is the ideal; reads a tool
submits through io_uring, as runai-model-streamer does, are not counted there), and
the peak RSS of the largest rank. Tools run in rotating order within each round.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench-data" / "llama-1gib"
TOOLS = ("aioloader", "runai", "fastsafetensors")
PACKAGES = {
    "aioloader": "aioloader",
    "runai": "runai_model_streamer",
    "fastsafetensors": "fastsafetensors",
}


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _load(tool: str, files: list[str], rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    if tool == "aioloader":
        import asyncio

        import aioloader

        return asyncio.run(aioloader.load_model(files, group=dist.group.WORLD, cache_dir=False))
    if tool == "runai":
        from runai_model_streamer import SafetensorsStreamer

        got = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files, device="cpu", is_distributed=True)
            for name, tensor in streamer.get_tensors():
                got[name] = tensor
        return got
    from fastsafetensors import SafeTensorsFileLoader

    loader = SafeTensorsFileLoader(dist.group.WORLD, device="cpu", nogds=True)
    try:
        loader.add_filenames({r: files[r::world] for r in range(world)})
        buffer = loader.copy_files_to_device()
        try:
            return {name: buffer.get_tensor(name) for name in sorted(buffer.key_to_rank_lidx)}
        finally:
            buffer.close()
    finally:
        loader.close()


def rank_main(tool: str, rank: int, world: int, port: int, files: list[str], out: str) -> None:
    import torch.distributed as dist

    os.environ["RUNAI_STREAMER_DIST"] = "1"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )  # fmt: skip
    import torch  # noqa: F401  (imported before the clock)

    # Each tool's package is imported before the clock too, and the full collection
    # that importing torch leaves pending is run now: whichever tool first allocates
    # a few hundred Python objects would pay it (70-80 ms measured) inside its load.
    importlib.import_module(PACKAGES[tool])
    gc.collect()
    dist.barrier()
    before = _rchar()
    started = time.perf_counter()
    got = _load(tool, files, rank, world)
    seconds = time.perf_counter() - started
    read = _rchar() - before
    nbytes = sum(t.nbytes for t in got.values())
    Path(out, f"{rank}.json").write_text(
        json.dumps({"seconds": seconds, "read": read, "bytes": nbytes, "rss": _peak_rss()})
    )
    dist.barrier()
    dist.destroy_process_group()


def warm(files: list[str]) -> None:
    for path in files:
        with open(path, "rb") as fh:
            while fh.read(16 << 20):
                pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def one_run(tool: str, world: int, files: list[str]) -> dict[str, float]:
    warm(files)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        procs = [
            context.Process(target=rank_main, args=(tool, r, world, port, files, out))
            for r in range(world)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(600)
            if proc.exitcode != 0:
                raise SystemExit(f"{tool}: a rank exited with {proc.exitcode}")
        ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]
    return {
        "seconds": max(r["seconds"] for r in ranks),
        "read": sum(r["read"] for r in ranks),
        "bytes": ranks[0]["bytes"],
        "rss": max(r["rss"] for r in ranks),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS))
    args = parser.parse_args()
    if not DATA.exists():
        import subprocess

        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "bench.py"), "--size-gib", "1",
             "--scenarios", "model-warm", "--tools", "preadv", "--repeat", "1"],
            check=True,
        )  # fmt: skip
    files = sorted(str(p) for p in DATA.glob("*.safetensors"))
    size = sum(os.path.getsize(f) for f in files)
    print(f"command: {' '.join(sys.orig_argv)}")
    print(f"model: {DATA} ({size / 1e9:.2f} GB, {len(files)} files)")
    for world in args.ranks:
        results: dict[str, list[dict[str, float]]] = {t: [] for t in args.tools}
        for round_ in range(args.rounds):
            tools = args.tools[round_ % len(args.tools) :] + args.tools[: round_ % len(args.tools)]
            for tool in tools:
                got = one_run(tool, world, files)
                results[tool].append(got)
                print(
                    f"  {world} ranks [{round_ + 1}/{args.rounds}] {tool:16s} "
                    f"{got['seconds']:.2f} s  read {got['read'] / size:.2f}x the files  "
                    f"peak RSS {got['rss'] / 2**30:.2f} GiB",
                    flush=True,
                )
        ours = [r["seconds"] for r in results.get("aioloader", [])]
        print(
            f"\n{world} ranks: tool, slowest rank's wall time (median, best), "
            "bytes read / file bytes, peak RSS"
        )
        for tool, runs in results.items():
            times = [r["seconds"] for r in runs]
            ratio = "-"
            if ours and tool != "aioloader":
                pairs = [t / o for o, t in zip(ours, times, strict=True)]
                ratio = f"{statistics.geometric_mean(pairs):.2f}x"
            print(
                f"  {tool:16s} {statistics.median(times):6.2f} s {min(times):6.2f} s   "
                f"{statistics.median(r['read'] for r in runs) / size:5.2f}x   "
                f"{max(r['rss'] for r in runs) / 2**30:5.2f} GiB   aioloader faster by {ratio}"
            )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
