"""One self-contained check of aioloader on a machine with an NVIDIA GPU.

    python scripts/gpu_check.py [--size-gib 20] [--dir /dev/shm/aioloader-gpu] [--out DIR]
    python scripts/gpu_check.py --dry-run      # every path the CPU allows, in seconds

It writes a Llama-shaped BF16 model (four shards) to ``--dir`` (tmpfs, so reads
come from memory and the GPU side is what is measured), then, each tool in its
own subprocess so that its peak host memory is its own:

1. correctness: every tensor aioloader puts on the GPU (torch) is compared bit
   for bit with ``safetensors.torch.load_file(..., device=...)``, and a small
   F16/F32/I32/U8 model loaded with ``framework="cupy"`` with
   ``safetensors.numpy.load_file``;
2. GB/s into the GPU, side by side in one run: aioloader,
   ``safetensors.torch.load_file(device=...)``, runai-model-streamer then
   ``.to(device)``, InstantTensor and fastsafetensors (``nogds=True``);
3. overlap efficiency: max(read-only, copy-only) over aioloader's total time, where
   read-only is the same load through the same pinned ring with the copies left out
   and copy-only is pinned host memory copied to the device in the same chunks;
4. peak host memory (growth of VmHWM after the CUDA context exists) against
   ``memory_limit``, and the longest stall of the event loop during the load.

``--dry-run`` runs the same script on a small model with the CPU standing in for
the GPU: aioloader through the pinned-ring path with the host copy engine, the
CuPy check with NumPy, every competitor that is installed with ``device="cpu"``.

The table goes to stdout and, with ``--out``, to ``gpu_check.txt`` beside one JSON
line per measurement in ``gpu_check.jsonl`` (written as each one finishes, so a
run cut short still leaves what it measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GiB = 1 << 30
MiB = 1 << 20
TOOLS = ("aioloader", "safetensors", "runai", "instanttensor", "fastsafetensors")
# Ceilings the issue sets for aioloader on the GPU.
OVERLAP_TARGET = 0.9
HOST_SLACK = GiB // 2
STALL_TARGET = 0.050
HEARTBEAT = 0.005
WORKER_TIMEOUT = 90


# ----------------------------------------------------------------------- helpers


def _rss_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    """Make VmHWM the current RSS, so the peak measured is this tool's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.safetensors"))


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def _sync(device: str) -> None:
    if _is_cuda(device):
        import torch

        torch.cuda.synchronize(device)


def _loop_runner() -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


class _Heartbeat:
    """Measures the longest time the event loop did not get back to a sleeping task."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(HEARTBEAT)
            self.longest = max(self.longest, time.perf_counter() - start - HEARTBEAT)

    def __enter__(self) -> _Heartbeat:
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def _read_only_engine(device: str) -> Any:
    """A copy engine that stages exactly as the GPU path does and copies nothing.

    On a GPU its ring is page-locked by the torch engine, as aioloader's is, so a
    load through it costs what the GPU path costs minus the copies.
    """
    from concurrent.futures import Future

    from aioloader.devices.staged import HostCopyEngine

    cuda = None
    if _is_cuda(device):
        from aioloader.devices.cuda import TorchCudaEngine

        cuda = TorchCudaEngine(device)

    class ReadOnly(HostCopyEngine):
        name = "read-only"

        def start(self) -> None:
            super().start()
            if cuda is not None:
                cuda.start()

        def pinned(self, nbytes: int) -> tuple[Any, memoryview]:
            return cuda.pinned(nbytes) if cuda is not None else super().pinned(nbytes)

        def submit(self, *args: Any) -> Any:
            done: Future[None] = Future()
            done.set_result(None)
            return done

    return ReadOnly()


def _aioloader_device(device: str) -> Any:
    """What aioloader is given: the device itself, or on a dry run the host copy engine,
    which takes the staged (GPU) path into host memory."""
    return device if _is_cuda(device) else _host_engine("torch")


def _host_engine(framework: str) -> Any:
    from aioloader.devices.staged import HostCopyEngine

    return HostCopyEngine(framework)


# ----------------------------------------------------------------------- workers


def _load_aioloader(folder: Path, device: Any, settings: dict[str, Any]) -> tuple[dict, dict]:
    import aioloader

    extra: dict[str, Any] = {}

    async def go() -> dict[str, Any]:
        with _Heartbeat() as beat:
            async with aioloader.Loader(device=device, **settings) as loader:
                first: float | None = None
                out = {}
                async with loader.stream(str(folder)) as stream:
                    async for name, tensor in stream:
                        if first is None:
                            first = time.perf_counter()
                        out[name] = tensor
                report = stream.report
                assert report is not None
                ring = getattr(loader._device, "ring", None)  # the ring's statistics
        extra.update(
            header_s=report.header_seconds,
            read_s=report.read_seconds,
            copy_s=report.copy_seconds,
            total_s=report.total_seconds,
            overlap=report.overlap,
            bottleneck=report.bottleneck,
            peak_staging=report.peak_staging_bytes,
            memory_limit=report.settings["memory_limit"],
            concurrency=report.settings["concurrency"],
            loop_stall=beat.longest,
            first_tensor_at=first,
            ring_slots=getattr(ring, "slots", None),
            ring_copies=getattr(ring, "copies", None),
            pinned=getattr(ring, "pinned_bytes", None),
        )
        return out

    return _loop_runner()(go()), extra


def _load_safetensors(files: list[str], device: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in files:
        tensors.update(load_file(path, device=device))
    return tensors


def _load_runai(files: list[str], device: str) -> dict[str, Any]:
    from runai_model_streamer import SafetensorsStreamer

    tensors: dict[str, Any] = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(files)
        for name, tensor in streamer.get_tensors():
            # Its tensors are views of a buffer it reuses: copy each out as it comes.
            tensors[name] = tensor.to(device, non_blocking=False, copy=True)
    return tensors


def _load_instanttensor(files: list[str], device: str) -> dict[str, Any]:
    import torch
    from instanttensor import safe_open  # type: ignore[import-not-found]

    target = torch.device(device)
    index = target.index if target.type == "cuda" else "cpu"
    if target.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    tensors: dict[str, Any] = {}
    with safe_open(files, framework="pt", device=index) as f:
        for name, tensor in f.tensors():
            tensors[name] = tensor
    return tensors


def _load_fastsafetensors(files: list[str], device: str) -> dict[str, Any]:
    from fastsafetensors import SafeTensorsFileLoader  # type: ignore[import-not-found]

    loader = SafeTensorsFileLoader(None, device, nogds=True)
    try:
        loader.add_filenames({0: files})
        buffers = loader.copy_files_to_device()
        try:
            tensors = {name: buffers.get_tensor(name) for name in loader.get_keys()}
        finally:
            buffers.close()
    finally:
        loader.close()
    return tensors


def _copy_only(
    files: list[str], device: str, chunk: int, ring: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pinned host memory to the device in ``chunk``-sized copies on one stream: the
    copy ceiling of the path aioloader takes. Also times page-locking the ring."""
    import torch

    total = sum(os.path.getsize(p) for p in files)
    slots = max(2, ring // chunk)
    start = time.perf_counter()
    pinned = torch.empty(chunk * slots, dtype=torch.uint8, pin_memory=_is_cuda(device))
    pin_seconds = time.perf_counter() - start
    target = torch.empty(total, dtype=torch.uint8, device=device)
    start = time.perf_counter()
    if _is_cuda(device):
        stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            for i, offset in enumerate(range(0, total, chunk)):
                n = min(chunk, total - offset)
                slot = (i % slots) * chunk
                target[offset : offset + n].copy_(pinned[slot : slot + n], non_blocking=True)
        stream.synchronize()
    else:
        for i, offset in enumerate(range(0, total, chunk)):
            n = min(chunk, total - offset)
            slot = (i % slots) * chunk
            target[offset : offset + n].copy_(pinned[slot : slot + n])
    extra = {
        "copy_s": time.perf_counter() - start,
        "pin_s": pin_seconds,
        "pinned_bytes": chunk * slots,
    }
    return {"all": target}, extra


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Load the model with one tool; time it and measure host memory."""
    tool, device, folder = spec["tool"], spec["device"], Path(spec["model"])
    settings = spec.get("settings", {})
    import torch  # imported before the clock and the event loop, as a server would have

    if _is_cuda(device) and not spec.get("cold_context"):
        torch.cuda.init()
        torch.empty(1, device=device)  # the CUDA context exists before the clock starts
    files = _files(folder)
    if tool.startswith("aioloader") or tool in ("read-only", "cupy-check"):
        import aioloader  # noqa: F401 - imported before the clock, as a server would have
    _reset_peak()
    base = _rss_peak()
    start = time.perf_counter()
    extra: dict[str, Any] = {}
    if tool == "aioloader":
        tensors, extra = _load_aioloader(folder, _aioloader_device(device), settings)
    elif tool == "aioloader-host":
        tensors, extra = _load_aioloader(folder, "cpu", settings)
    elif tool == "read-only":
        tensors, extra = _load_aioloader(folder, _read_only_engine(device), settings)
    elif tool == "copy-only":
        tensors, extra = _copy_only(files, device, spec["chunk"], spec["ring"])
    elif tool == "safetensors":
        tensors = _load_safetensors(files, device)
    elif tool == "runai":
        tensors = _load_runai(files, device)
    elif tool == "instanttensor":
        tensors = _load_instanttensor(files, device)
    elif tool == "fastsafetensors":
        tensors = _load_fastsafetensors(files, device)
    elif tool == "check-torch":
        return {"tool": tool, "result": check_torch(folder, device)}
    elif tool == "check-cupy":
        return {"tool": tool, "result": check_cupy(folder, device)}
    else:
        raise SystemExit(f"unknown tool {tool}")
    _sync(device)
    seconds = time.perf_counter() - start
    if "first_tensor_at" in extra and extra["first_tensor_at"] is not None:
        extra["first_tensor_s"] = extra.pop("first_tensor_at") - start
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return {
        "tool": spec.get("label", tool),
        "seconds": seconds,
        "bytes": nbytes,
        "host_peak": _rss_peak() - base,
        **extra,
    }


# ----------------------------------------------------------------------- correctness


def check_torch(folder: Path, device: str) -> str:
    import torch
    from safetensors.torch import load_file

    import aioloader

    got = _loop_runner()(aioloader.load_model(str(folder), device=_aioloader_device(device)))
    compared = 0
    for path in _files(folder):
        for name, want in load_file(path, device=device).items():
            have = got.pop(name, None)
            if have is None:
                return f"MISMATCH: {name!r} ({path}) is missing"
            same = (
                have.device == want.device
                and have.dtype == want.dtype
                and have.shape == want.shape
                and torch.equal(have.view(torch.uint8), want.view(torch.uint8))
            )
            if not same:
                return f"MISMATCH in {name!r} ({path}): {have.dtype} {tuple(have.shape)}"
            compared += 1
    if got:
        return f"MISMATCH: extra tensors {sorted(got)[:3]}"
    return f"ok: {compared} tensors (torch) bit-identical to safetensors on {device}"


def check_cupy(folder: Path, device: str) -> str:
    """framework='cupy' on a GPU (framework='numpy' through the staged ring on a dry run)."""
    import numpy as np
    from safetensors.numpy import load_file

    import aioloader

    if _is_cuda(device):
        import cupy

        index = int(device.partition(":")[2] or 0)
        got = _loop_runner()(aioloader.load_model(str(folder), device=device, framework="cupy"))
        kind = "CuPy"

        def host(array: Any) -> Any:
            if not isinstance(array, cupy.ndarray) or array.device.id != index:
                raise TypeError(f"not a CuPy array on GPU {index}: {type(array)}")
            return cupy.asnumpy(array)
    else:
        got = _loop_runner()(
            aioloader.load_model(str(folder), device=_host_engine("numpy"), framework="numpy")
        )
        kind = "NumPy through the staged ring (dry run)"

        def host(array: Any) -> Any:
            return array

    compared = 0
    for path in _files(folder):
        for name, want in load_file(path).items():
            have = host(got.pop(name))
            if have.dtype != want.dtype or have.shape != want.shape:
                return f"MISMATCH in {name!r}: {have.dtype} {have.shape} vs {want.dtype}"
            if not np.array_equal(have.view(np.uint8), want.view(np.uint8)):
                return f"MISMATCH in the bytes of {name!r} ({path})"
            compared += 1
    if got:
        return f"MISMATCH: extra arrays {sorted(got)[:3]}"
    return f"ok: {compared} arrays ({kind}) bit-identical to safetensors.numpy"


def write_cupy_model(folder: Path) -> None:
    """Dtypes CuPy holds (no BF16), odd shapes included, across two shards."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    first = {
        "f16.weight": rng.standard_normal((1024, 4096)).astype(np.float16),
        "f32.bias": rng.standard_normal(4099).astype(np.float32),
        "i32.index": rng.integers(-(2**31), 2**31 - 1, 12345, dtype=np.int32),
    }
    second = {
        "u8.mask": rng.integers(0, 255, (777, 333), dtype=np.uint8),
        "f64.scale": rng.standard_normal((3, 5, 7)).astype(np.float64),
        "f32.large": rng.standard_normal((4096, 8192)).astype(np.float32),
    }
    save_file(first, str(folder / "model-00001-of-00002.safetensors"))
    save_file(second, str(folder / "model-00002-of-00002.safetensors"))


# ----------------------------------------------------------------------- driver


class Run:
    """Runs workers in subprocesses and records each result as it arrives."""

    def __init__(self, device: str, out: Path | None) -> None:
        self.device = device
        self.out = out
        self.lines: list[str] = []
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "gpu_check.jsonl").write_text("")

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)
        if self.out is not None:
            (self.out / "gpu_check.txt").write_text("\n".join(self.lines) + "\n")

    def worker(self, spec: dict[str, Any]) -> dict[str, Any]:
        spec = {"device": self.device, **spec}
        command = [sys.executable, __file__, "--worker", json.dumps(spec)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        label = spec.get("label", spec["tool"])
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=WORKER_TIMEOUT,
                check=False,
                env=env,
            )
        except subprocess.TimeoutExpired:
            result: dict[str, Any] = {"tool": label, "error": f"timed out after {WORKER_TIMEOUT}s"}
        else:
            lines = done.stdout.strip().splitlines()
            if done.returncode != 0 or not lines:
                tail = (done.stderr.strip().splitlines() or ["failed"])[-1]
                result = {"tool": label, "error": tail[:300], "stderr": done.stderr[-3000:]}
            else:
                result = json.loads(lines[-1])
        if self.out is not None:
            with open(self.out / "gpu_check.jsonl", "a") as f:
                f.write(json.dumps(result) + "\n")
        if "error" in result:
            print(f"  {label}: {result['error']}", file=sys.stderr, flush=True)
        return result


def make_model(folder_root: Path, size_gib: float) -> Path:
    """The bench's Llama-shaped model, its shards written in parallel."""
    sys.path.insert(0, str(HERE))
    import random

    import bench

    dataset = bench.model_dataset(folder_root, size_gib)
    if not bench.is_complete(dataset):
        block = random.Random(0).randbytes(bench.FILL_BLOCK)
        with ThreadPoolExecutor(len(dataset.files)) as pool:
            list(pool.map(lambda plan: bench.write_safetensors(plan, block), dataset.files))
        index = dataset.target / "model.safetensors.index.json"
        index.write_text(json.dumps(bench.index_json(dataset), indent=2) + "\n")
    return dataset.target


def _row(run: Run, r: dict[str, Any], ours: dict[str, Any] | None) -> None:
    if "error" in r:
        run.say(f"{r['tool']:<22} {'-':>7} {'-':>8} {'-':>10} {'-':>8}  {r['error']}")
        return
    rate = r["bytes"] / r["seconds"] / 1e9
    note = ""
    if ours is not None and r is not ours:
        note = f"aioloader/this {r['seconds'] / ours['seconds']:.2f}x"
    first = f"{r['first_tensor_s']:.2f}" if r.get("first_tensor_s") is not None else "-"
    run.say(
        f"{r['tool']:<22} {rate:7.2f} {r['seconds']:8.2f} {r['host_peak'] / GiB:10.2f} "
        f"{first:>8}  {note}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=20.0)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm/aioloader-gpu"))
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument(
        "--memory-limit", default=None, help="aioloader's memory_limit (default: its own default)"
    )
    parser.add_argument("--tools", nargs="*", default=list(TOOLS))
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],  # e.g. memory_limit=512MiB
        help="extra aioloader rows, e.g. memory_limit=512MiB,concurrency=32",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--dry-run", action="store_true", help="a small model, the CPU standing in for the GPU"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0

    if args.dry_run:
        args.device = "cpu"
        args.size_gib = min(args.size_gib, 0.25)
    else:
        import torch

        if not torch.cuda.is_available():
            print(
                "no CUDA device: this check needs an NVIDIA GPU (torch.cuda.is_available() is "
                "False); use --dry-run to exercise it on the CPU"
            )
            return 2
    run = Run(args.device, args.out)
    import platform

    import torch

    name = torch.cuda.get_device_name(args.device) if _is_cuda(args.device) else "cpu (dry run)"
    run.say(f"command: {' '.join(sys.argv)}")
    run.say(
        f"device: {name}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}"
    )
    start = time.perf_counter()
    folder = make_model(args.dir, args.size_gib)
    cupy_folder = args.dir / "cupy-dtypes"
    write_cupy_model(cupy_folder)
    size = sum(os.path.getsize(p) for p in _files(folder))
    run.say(
        f"model: {folder} ({size / GiB:.2f} GiB, {len(_files(folder))} shards, "
        f"ready in {time.perf_counter() - start:.1f} s)"
    )

    settings: dict[str, Any] = {}
    if args.memory_limit:
        settings["memory_limit"] = args.memory_limit
    for check, where in (("check-torch", folder), ("check-cupy", cupy_folder)):
        r = run.worker({"tool": check, "model": str(where)})
        run.say(f"correctness ({check[6:]}): {r.get('result', r.get('error'))}")

    results = []
    for tool in args.tools:
        spec: dict[str, Any] = {"tool": tool, "model": str(folder)}
        if tool == "aioloader":
            spec["settings"] = settings
        results.append(run.worker(spec))
    for variant in args.variants:
        extra = dict(kv.split("=", 1) for kv in variant.split(","))
        typed = {k: int(v) if v.isdigit() else v for k, v in extra.items()}
        results.append(
            run.worker(
                {
                    "tool": "aioloader",
                    "model": str(folder),
                    "settings": {**settings, **typed},
                    "label": f"aioloader {variant}",
                }
            )
        )
    if "aioloader" in args.tools:
        # The same load in a process whose CUDA context does not exist yet: aioloader
        # creates it off the event loop (its time is then part of the load).
        results.append(
            run.worker(
                {
                    "tool": "aioloader",
                    "model": str(folder),
                    "settings": settings,
                    "cold_context": True,
                    "label": "aioloader (new context)",
                }
            )
        )
    ours = next((r for r in results if r["tool"] == "aioloader" and "error" not in r), None)
    chunk = 16 * MiB
    ring = ours["ring_slots"] * chunk if ours is not None else 512 * MiB
    read_only = run.worker({"tool": "read-only", "model": str(folder), "settings": settings})
    copy_only = run.worker(
        {"tool": "copy-only", "model": str(folder), "chunk": chunk, "ring": ring}
    )
    host = run.worker({"tool": "aioloader-host", "model": str(folder), "settings": settings})

    run.say(f"\n{'tool':<22} {'GB/s':>7} {'seconds':>8} {'host GiB':>10} {'1st s':>8}  notes")
    for r in results:
        _row(run, r, ours)
    for r in (read_only, copy_only, host):
        _row(run, {**r, "tool": f"({r['tool']})"}, None)
    if ours is None:
        run.say("\naioloader failed: no overlap or memory figures")
        return 1
    run.say(
        f"\naioloader: header {ours['header_s']:.2f} s, read {ours['read_s']:.2f} s, copy "
        f"{ours['copy_s']:.2f} s, total {ours['total_s']:.2f} s (report), overlap "
        f"{ours['overlap']:.0%}, bottleneck {ours['bottleneck']}, ring "
        f"{ours['ring_slots']} slots ({ours['pinned'] / MiB:.0f} MiB pinned), peak staging "
        f"{ours['peak_staging'] / GiB:.2f} GiB"
    )
    verdicts = []
    if "error" not in read_only and "error" not in copy_only:
        floor = max(read_only["seconds"], copy_only["copy_s"])
        efficiency = floor / ours["seconds"]
        run.say(
            f"overlap efficiency: max(read-only {read_only['seconds']:.2f} s, copy-only "
            f"{copy_only['copy_s']:.2f} s) / aioloader {ours['seconds']:.2f} s = "
            f"{efficiency:.2f} (pinning {copy_only['pinned_bytes'] / MiB:.0f} MiB took "
            f"{copy_only['pin_s']:.2f} s)"
        )
        verdicts.append(("overlap efficiency >= 0.9", efficiency >= OVERLAP_TARGET))
    limit = ours["memory_limit"]
    run.say(
        f"host peak {ours['host_peak'] / GiB:.2f} GiB against memory_limit "
        f"{limit / GiB:.2f} GiB (+0.5 GiB allowed)"
    )
    verdicts.append(
        ("host peak <= memory_limit + 0.5 GiB", ours["host_peak"] <= limit + HOST_SLACK)
    )
    run.say(f"longest event-loop stall during the load: {ours['loop_stall'] * 1000:.1f} ms")
    for r in results:
        if r["tool"] != "aioloader" and "loop_stall" in r:
            run.say(f"  {r['tool']}: longest loop stall {r['loop_stall'] * 1000:.1f} ms")
    verdicts.append(("loop never stalled over 50 ms", ours["loop_stall"] <= STALL_TARGET))
    instant = next((r for r in results if r["tool"] == "instanttensor" and "error" not in r), None)
    if instant is not None:
        verdicts.append(("at least InstantTensor's GB/s", ours["seconds"] <= instant["seconds"]))
    run.say(
        "targets: " + "; ".join(f"{what}: {'met' if ok else 'MISSED'}" for what, ok in verdicts)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
