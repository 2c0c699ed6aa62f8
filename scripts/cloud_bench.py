"""gs:// and az:// on emulators: aioloader beside runai-model-streamer's GCS and Azure backends.

    bash scripts/azurite_setup.sh && .venv/bin/python scripts/cloud_bench.py [--size-mib 256]

gcp-storage-emulator (a Python server) and Azurite (node) run as processes of their
own on 127.0.0.1, holding one model (two shards). Each load is a fresh worker
process; the table gives wall time and the worker's CPU seconds (user + system).
An emulator measures the client's requests and CPU cost, not a cloud's bandwidth:
both emulators are far slower than the real services, and a client that makes
fewer, larger requests gains here what it may not gain there.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOOLS = ("aioloader", "runai")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port}")


def worker(tool: str, urls: list[str]) -> dict[str, Any]:
    """One load in this process: wall and CPU seconds, bytes."""
    import torch  # noqa: F401  (imported before the clock, for both tools)

    before = os.times()
    started = time.perf_counter()
    if tool == "aioloader":
        import asyncio

        import aioloader

        tensors = asyncio.run(aioloader.load_model(urls, cache_dir=False))
        nbytes = sum(t.nbytes for t in tensors.values())
    else:
        from runai_model_streamer import SafetensorsStreamer

        nbytes = 0
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(urls)
            kept = dict(streamer.get_tensors())
            nbytes = sum(t.nbytes for t in kept.values())
    seconds = time.perf_counter() - started
    after = os.times()
    cpu = (after.user - before.user) + (after.system - before.system)
    return {"seconds": seconds, "cpu": cpu, "bytes": nbytes}


def run_worker(tool: str, urls: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The worker's result, or ``{"error": its last line}`` when it failed."""
    done = subprocess.run(
        [sys.executable, __file__, "--worker", tool, *urls],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def make_model(folder: Path, size_mib: int) -> list[Path]:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    per_shard = size_mib // 2
    paths = []
    for shard in range(2):
        tensors = {
            f"s{shard}.w{i:03d}": torch.randn(1 << 20, generator=gen)  # 4 MiB each
            for i in range(per_shard // 4)
        }
        path = folder / f"model-{shard + 1:05d}-of-00002.safetensors"
        save_file(tensors, str(path))
        paths.append(path)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1:])))
        return 0

    from tests.azure_server import AZURITE, AzuriteServer
    from tests.gcs_server import GcsEmulator

    print(f"command: {' '.join(sys.orig_argv)}")
    with tempfile.TemporaryDirectory() as tmp:
        files = make_model(Path(tmp), args.size_mib)
        size = sum(p.stat().st_size for p in files)
        port = free_port()
        gcs = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
             "--port", str(port), "--in-memory", "-q"],
        )  # fmt: skip
        wait_port(port)
        emulator = GcsEmulator()
        emulator.port = port
        emulator.create_bucket("bench")
        for path in files:
            emulator.put("bench", f"m/{path.name}", path.read_bytes())
        stores: dict[str, tuple[list[str], dict[str, str]]] = {
            "gcs": (
                [f"gs://bench/m/{p.name}" for p in files],
                {
                    "STORAGE_EMULATOR_HOST": emulator.endpoint,
                    # runai's GCS backend (google-cloud-cpp) reads this one
                    "CLOUD_STORAGE_EMULATOR_ENDPOINT": emulator.endpoint,
                },
            )
        }
        azurite = None
        if AZURITE.exists():
            azurite = AzuriteServer().start()
            azurite.upload("bench", "m", Path(tmp))
            stores["azure"] = (
                [f"az://bench/m/{p.name}" for p in files],
                {
                    "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string,
                    "AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1",
                },
            )
        try:
            print(f"model {size / 2**20:.0f} MiB in 2 files")
            for store, (urls, extra) in stores.items():
                env = {**os.environ, **extra}
                results: dict[str, list[dict[str, Any]]] = {t: [] for t in TOOLS}
                for round_ in range(args.rounds):
                    for tool in TOOLS[round_ % 2 :] + TOOLS[: round_ % 2]:
                        got = run_worker(tool, urls, env)
                        if "error" in got:
                            print(f"  {store} [{round_ + 1}/{args.rounds}] {tool:10s} failed: "
                                  f"{got['error']}", flush=True)  # fmt: skip
                            continue
                        assert got["bytes"] > size * 0.99, got
                        results[tool].append(got)
                        print(
                            f"  {store} [{round_ + 1}/{args.rounds}] {tool:10s} "
                            f"{got['seconds']:.2f} s  CPU {got['cpu']:.2f} s",
                            flush=True,
                        )
                ours = [r["seconds"] for r in results["aioloader"]]
                for tool, runs in results.items():
                    if not runs or len(runs) != len(ours):
                        print(f"{store:6s} {tool:10s} failed in {args.rounds - len(runs)} run(s)")
                        continue
                    times = [r["seconds"] for r in runs]
                    cpu = statistics.median(r["cpu"] for r in runs)
                    ratio = statistics.geometric_mean(
                        [t / o for o, t in zip(ours, times, strict=True)]
                    )
                    print(
                        f"{store:6s} {tool:10s} median {statistics.median(times):.2f} s "
                        f"({size / statistics.median(times) / 1e9:.2f} GB/s), best "
                        f"{min(times):.2f} s, CPU {cpu:.2f} s; aioloader faster by {ratio:.2f}x "
                        "round by round"
                    )
        finally:
            gcs.terminate()
            gcs.wait()
            if azurite is not None:
                azurite.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
