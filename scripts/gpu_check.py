"""One self-contained check of aioloader on a machine with an NVIDIA GPU.

    python scripts/gpu_check.py [--size-gib 20] [--dir /dev/shm/aioloader-gpu] [--device cuda:0]

It writes a Llama-shaped model (several shards) to ``--dir`` (``/dev/shm`` by
default, so reads come from memory and the GPU side is what is measured), then:

1. correctness: every tensor loaded by aioloader onto the GPU is compared bit for
   bit with ``safetensors.torch.load_file(..., device=...)``;
2. throughput into the GPU, side by side in one run: aioloader,
   ``safetensors.torch.load_file(device=...)``, runai-model-streamer then
   ``.to(device)``, and InstantTensor when its wheel is installed;
3. overlap efficiency: aioloader's total time against max(read-only,
   copy-only), where read-only is the same load into host memory and copy-only
   is pinned host memory copied to the device in the same chunks;
4. peak host memory (RSS growth) of each tool, against aioloader's memory_limit.

Each tool runs in its own subprocess so its peak memory is its own. It prints one
table and should finish in under 5 minutes for ~20 GB on a 16-core H200 machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GiB = 1 << 30
TOOLS = ("aioloader", "safetensors", "runai", "instanttensor")


def _rss_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.safetensors"))


def _sync(device: str) -> None:
    import torch

    torch.cuda.synchronize(device)


def worker(tool: str, folder: Path, device: str, memory_limit: str) -> dict[str, Any]:
    """Load the model with one tool onto ``device``; time it and measure host memory."""
    import torch

    torch.cuda.init()
    torch.empty(1, device=device)  # create the CUDA context before timing
    files = _files(folder)
    _reset_peak()
    base = _rss_peak()
    start = time.perf_counter()
    if tool == "aioloader":
        import asyncio

        import aioloader

        async def go() -> dict[str, Any]:
            async with aioloader.Loader(device=device, memory_limit=memory_limit) as loader:
                async with loader.stream(str(folder)) as stream:
                    out = {name: t async for name, t in stream}
                report = stream.report
                assert report is not None
                extra.update(
                    read_s=report.read_seconds, copy_s=report.copy_seconds,
                    overlap=report.overlap, bottleneck=report.bottleneck,
                )  # fmt: skip
                return out

        extra: dict[str, Any] = {}
        tensors = asyncio.run(go())
    elif tool == "aioloader-host":
        import asyncio

        import aioloader

        extra = {}
        tensors = asyncio.run(aioloader.load_model(str(folder)))
    elif tool == "copy-only":
        extra = {}
        tensors = _copy_only(files, device)
    elif tool == "safetensors":
        from safetensors.torch import load_file

        extra = {}
        tensors = {}
        for path in files:
            tensors.update(load_file(path, device=device))
    elif tool == "runai":
        from runai_model_streamer import SafetensorsStreamer

        extra = {}
        tensors = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files)
            for name, tensor in streamer.get_tensors():
                tensors[name] = tensor.to(device, non_blocking=True)
    elif tool == "instanttensor":
        import instanttensor  # type: ignore[import-not-found]

        extra = {}
        tensors = {}
        for path in files:
            tensors.update(instanttensor.load_file(path, device=device))
    else:
        raise SystemExit(f"unknown tool {tool}")
    if device.startswith("cuda") and tool != "aioloader-host":
        _sync(device)
    seconds = time.perf_counter() - start
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return {"tool": tool, "seconds": seconds, "bytes": nbytes,
            "host_peak": _rss_peak() - base, **extra}  # fmt: skip


def _copy_only(files: list[str], device: str) -> dict[str, Any]:
    """Pinned host memory to the device in 32 MiB chunks: the copy ceiling."""
    import torch

    total = sum(os.path.getsize(p) for p in files)
    chunk = 32 << 20
    pinned = torch.empty(chunk * 4, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(total, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        for i, offset in enumerate(range(0, total, chunk)):
            n = min(chunk, total - offset)
            slot = (i % 4) * chunk
            target[offset : offset + n].copy_(pinned[slot : slot + n], non_blocking=True)
    stream.synchronize()
    return {"all": target}


def check_correctness(folder: Path, device: str) -> str:
    import asyncio

    import torch
    from safetensors.torch import load_file

    import aioloader

    got = asyncio.run(aioloader.load_model(str(folder), device=device))
    compared = 0
    for path in _files(folder):
        for name, want in load_file(path, device=device).items():
            have = got.pop(name)
            same = (
                have.device == want.device
                and have.dtype == want.dtype
                and have.shape == want.shape
                and torch.equal(have.view(torch.uint8), want.view(torch.uint8))
            )
            if not same:
                return f"MISMATCH in {name!r} ({path})"
            compared += 1
    if got:
        return f"MISMATCH: extra tensors {sorted(got)[:3]}"
    return f"ok: {compared} tensors bit-identical to safetensors on {device}"


def run(tool: str, folder: Path, device: str, memory_limit: str) -> dict[str, Any]:
    command = [
        sys.executable, __file__, "--worker", tool, "--dir", str(folder.parent),
        "--device", device, "--memory-limit", memory_limit, "--model", str(folder),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
        return {"tool": tool, "error": reason}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=20.0)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm/aioloader-gpu"))
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--memory-limit", default="4GiB")
    parser.add_argument("--tools", nargs="*", default=list(TOOLS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.device, args.memory_limit)))
        return 0

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        return 2
    sys.path.insert(0, str(HERE))
    import bench

    print(f"command: {' '.join(sys.argv)}")
    print(f"device: {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    datasets = bench.prepare_data(args.dir, args.size_gib, {"model"})
    folder = datasets["model"].target
    size = sum(os.path.getsize(p) for p in _files(folder))
    print(f"model: {folder} ({size / GiB:.2f} GiB)")
    print(f"correctness: {check_correctness(folder, args.device)}")

    results = [run(tool, folder, args.device, args.memory_limit) for tool in args.tools]
    read_only = run("aioloader-host", folder, "cpu", args.memory_limit)
    copy_only = run("copy-only", folder, args.device, args.memory_limit)

    print(f"\n{'tool':<14} {'GB/s':>7} {'seconds':>8} {'host peak GiB':>14}  notes")
    ours = next((r for r in results if r["tool"] == "aioloader" and "error" not in r), None)
    for r in results:
        if "error" in r:
            print(f"{r['tool']:<14} {'-':>7} {'-':>8} {'-':>14}  {r['error']}")
            continue
        rate = r["bytes"] / r["seconds"] / 1e9
        note = ""
        if ours is not None and r is not ours:
            note = f"aioloader is {r['seconds'] / ours['seconds']:.2f}x faster"
        print(
            f"{r['tool']:<14} {rate:7.2f} {r['seconds']:8.2f} {r['host_peak'] / GiB:14.2f}  {note}"
        )
    if ours is not None and "error" not in read_only and "error" not in copy_only:
        floor = max(read_only["seconds"], copy_only["seconds"])
        print(f"\nread-only (to host) {read_only['seconds']:.2f} s, copy-only (pinned -> device) "
              f"{copy_only['seconds']:.2f} s, aioloader {ours['seconds']:.2f} s")  # fmt: skip
        print(f"overlap efficiency max(read, copy) / total: {floor / ours['seconds']:.2f}")
        print(f"aioloader report: read {ours['read_s']:.2f} s, copy {ours['copy_s']:.2f} s, "
              f"overlap {ours['overlap']:.0%}, bottleneck {ours['bottleneck']}")  # fmt: skip
        print(
            f"host peak {ours['host_peak'] / GiB:.2f} GiB against memory_limit {args.memory_limit}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
