#!/usr/bin/env python
"""hf:// against the Hugging Face way, side by side in one run, on a local Hub.

    python scripts/hf_bench.py [--size-mib 512] [--shards 4] [--repeat 3] [--staged host-copy]

A local Hub (tests/hub_server.py: the Hub's API on one port) runs in a process of
its own, and redirects to a storage host serving ranges: nginx over the blobs
(``--storage nginx``, the default, as the HTTP scenarios of scripts/bench.py use),
or the test suite's single-process Python server (``--storage python``); every tool runs in a fresh
process per measurement, in turn, each with an empty Hugging Face cache for the cold
rows, after the dirty pages of the one before were written back (``os.sync``); the
cache is read through once before each warm row, so each starts from the page cache, and
the warm rows take turns at running first (see the comments in ``main``). Rows:

* cold, to the loaded dict: aioloader ``load_model("hf://...")`` against
  ``huggingface_hub.snapshot_download`` followed by ``safetensors.torch.load_file`` of
  every shard; aioloader's time until its HF cache writes are committed too;
* warm, from the cache both wrote: aioloader ``hf://`` (reading the HF cache), against
  ``safetensors`` from the same snapshot folder, and aioloader on that folder as local
  files (our local-file speed);
* with ``--staged host-copy`` (or ``cuda``), cold loads through the staging ring, the GPU
  path, with the HF cache written through as the bytes arrive and without it.

Every tool imports its libraries before its clock starts (huggingface_hub's API
module and HTTP client too, which ``snapshot_download`` imports), and touches one
byte of every page of every tensor before its clock stops
(``safetensors.torch.load_file`` maps the file and would otherwise read nothing).
Medians are printed with ratios to the row each is compared with; these machines are
noisy, so read the ratios, not the absolute times, and the round-by-round ratios most.
huggingface_hub 2.x no longer uses ``hf_transfer`` (``HF_HUB_ENABLE_HF_TRANSFER`` only
warns); ``hf_xet`` speeds up Xet storage only, and the local Hub serves plain HTTP.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from bench.stats import geometric_interval  # scripts/bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent
REPO = "bench/model"

_HUB = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    from safetensors.torch import save
    sys.path.insert(0, sys.argv[1])
    from tests.hub_server import LocalHub
    root, size_mib, shards = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    gen = torch.Generator().manual_seed(0)
    per = size_mib * (1 << 20) // 4 // shards // 8
    files, weight_map = {}, {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layer.{s}.{i}": torch.randn(per, generator=gen) for i in range(8)}
        files[name] = save(tensors)
        weight_map.update({t: name for t in tensors})
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    files["config.json"] = b'{"model_type": "bench"}'
    hub = LocalHub(root).start()
    hub.commit(sys.argv[5], files)
    stopping = []
    if sys.argv[6] == "nginx":  # the storage host: nginx over the same blobs, not Python
        sys.path.insert(0, str(Path(sys.argv[1]) / "scripts"))
        from bench.nginx import nginx_server
        served = nginx_server(root / "hub-storage")
        url = served.__enter__()
        stopping.append(served)
        python_storage = hub.storage

        class Storage:
            def stop(self):
                python_storage.stop()

        Storage.url = url
        hub.storage = Storage()
    print(hub.url, flush=True)
    sys.stdin.read()
    hub.stop()
    for served in stopping:
        served.__exit__(None, None, None)
    """
)

# Inside the clock: one byte of every page of every tensor (see the module docstring).
_TOUCH = (
    "def touch(got):\n"
    "    return sum(int(t.view(-1).view(torch.uint8)[::4096].sum()) for t in got.values())\n"
)

_TOOLS = {
    "aioloader-cold": textwrap.dedent(
        """
        import asyncio, gc, json, sys, time
        import torch  # before the clock, as the others do
        import huggingface_hub.hf_api  # with its HTTP client, as the others import it
        import aioloader
        gc.collect()
        async def main():
            start = time.perf_counter()
            got = await aioloader.load_model(sys.argv[1])
            touch(got)
            loaded = time.perf_counter() - start
            await aioloader.wait_hf_cache()
            return loaded, time.perf_counter() - start, sum(t.nbytes for t in got.values())
        loaded, committed, nbytes = asyncio.run(main())
        print(json.dumps({"seconds": loaded, "committed": committed, "bytes": nbytes}))
        """
    ),
    "snapshot-then-load": textwrap.dedent(
        """
        import gc, json, sys, time
        from pathlib import Path
        import torch
        from huggingface_hub import snapshot_download
        from safetensors.torch import load_file
        gc.collect()
        start = time.perf_counter()
        folder = Path(snapshot_download(sys.argv[2]))
        got = {}
        for shard in sorted(folder.glob("*.safetensors")):
            got.update(load_file(str(shard)))
        touch(got)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "bytes": sum(t.nbytes for t in got.values())}))
        """
    ),
    "aioloader-warm": textwrap.dedent(
        """
        import asyncio, gc, json, sys, time
        import torch  # before the clock, as the others do
        import huggingface_hub.hf_api  # with its HTTP client, as the others import it
        import aioloader
        gc.collect()
        start = time.perf_counter()
        got = asyncio.run(aioloader.load_model(sys.argv[1]))
        touch(got)
        print(json.dumps({"seconds": time.perf_counter() - start,
                          "bytes": sum(t.nbytes for t in got.values())}))
        """
    ),
    "safetensors-warm": textwrap.dedent(
        """
        import gc, json, sys, time
        from pathlib import Path
        import torch
        from huggingface_hub import snapshot_download
        from safetensors.torch import load_file
        folder = Path(snapshot_download(sys.argv[2], local_files_only=True))
        gc.collect()
        start = time.perf_counter()
        got = {}
        for shard in sorted(folder.glob("*.safetensors")):
            got.update(load_file(str(shard)))
        touch(got)  # load_file maps the file: read it
        print(json.dumps({"seconds": time.perf_counter() - start,
                          "bytes": sum(t.nbytes for t in got.values())}))
        """
    ),
    "aioloader-local": textwrap.dedent(
        """
        import asyncio, gc, json, sys, time
        from huggingface_hub import snapshot_download
        import torch  # before the clock, as the others do
        import aioloader
        folder = snapshot_download(sys.argv[2], local_files_only=True)
        gc.collect()
        start = time.perf_counter()
        got = asyncio.run(aioloader.load_model(folder))
        touch(got)
        print(json.dumps({"seconds": time.perf_counter() - start,
                          "bytes": sum(t.nbytes for t in got.values())}))
        """
    ),
    # --staged: a cold load through the staging ring (the GPU path), with and without
    # the Hugging Face cache written through as the bytes arrive.
    "staged": textwrap.dedent(
        """
        import asyncio, gc, json, os, sys, time
        import torch
        import huggingface_hub.hf_api
        import aioloader
        from aioloader.devices.staged import HostCopyEngine
        gc.collect()
        name = os.environ["BENCH_DEVICE"]
        device = HostCopyEngine() if name == "host-copy" else name
        async def main():
            start = time.perf_counter()
            cache = os.environ["BENCH_HF_CACHE"] == "1"
            async with aioloader.Loader(device=device, hf_cache=cache) as loader:
                got = await loader.load(sys.argv[1])
                touch(got)
            loaded = time.perf_counter() - start
            await aioloader.wait_hf_cache()
            return loaded, time.perf_counter() - start, sum(t.nbytes for t in got.values())
        loaded, committed, nbytes = asyncio.run(main())
        print(json.dumps({"seconds": loaded, "committed": committed, "bytes": nbytes}))
        """
    ),
}


def _read_through(folder: Path) -> None:
    """Read every file under ``folder`` once, so that it is in the page cache."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb", buffering=0) as file:
                while file.read(8 << 20):
                    pass


def _run(tool: str, env: dict[str, str], warm: Path | None = None) -> dict[str, float]:
    # The previous tool's cache files are written back to disk first, not during this
    # one: huggingface_hub does not sync what it downloads, and the writeback of a GiB
    # of dirty pages slowed whichever tool ran next to it by up to 2x.
    os.sync()
    if warm is not None:
        # Each warm row starts from the page cache: this VM's proactive reclaim drops
        # pages unused for a few seconds, so the row run first would read the disk.
        _read_through(warm)
    done = subprocess.run(
        [sys.executable, "-c", "import torch\n" + _TOUCH + _TOOLS[tool], f"hf://{REPO}", REPO],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{tool} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--staged",
        metavar="DEVICE",
        help="also time cold loads through the staging ring, with and without the HF cache "
        "written through: host-copy (the GPU path on the CPU) or cuda",
    )
    parser.add_argument(
        "--storage",
        choices=("nginx", "python"),
        default="nginx",
        help="what serves the blobs the Hub redirects to (default nginx, installed with "
        "apt-get install nginx; python: the test suite's single-process server)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hf-bench-") as tmp:
        work = Path(tmp)
        hub = subprocess.Popen(
            [sys.executable, "-c", _HUB, str(ROOT), str(work / "hub"), str(args.size_mib),
             str(args.shards), REPO, args.storage],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert hub.stdout is not None
        endpoint = hub.stdout.readline().strip()
        base = {
            **os.environ,
            "HF_ENDPOINT": endpoint,
            "HF_TOKEN_PATH": str(work / "no-token"),
            "PYTHONPATH": str(ROOT),
        }
        base.pop("HF_TOKEN", None)
        base.pop("HF_HUB_OFFLINE", None)
        times: dict[str, list[float]] = {tool: [] for tool in _TOOLS if tool != "staged"}
        committed: list[float] = []
        staged_committed: list[float] = []  # staged-cache: until its HF cache is written
        nbytes = 0
        try:
            for round_ in range(args.repeat):
                caches = {name: work / f"cache-{round_}-{name}" for name in ("ours", "theirs")}
                cold = [("aioloader-cold", "ours"), ("snapshot-then-load", "theirs")]
                for tool, cache in cold if round_ % 2 == 0 else cold[::-1]:
                    env = {
                        **base,
                        "HF_HOME": str(caches[cache]),
                        "HF_HUB_CACHE": str(caches[cache] / "hub"),
                    }
                    got = _run(tool, env)
                    times[tool].append(got["seconds"])
                    print(f"round {round_ + 1}: {tool} {got['seconds']:.2f} s", file=sys.stderr)
                    nbytes = int(got["bytes"])
                    if "committed" in got:
                        committed.append(got["committed"])
                if args.staged:
                    staged = [("staged-cache", "1"), ("staged-nocache", "0")]
                    for tool, cache in staged if round_ % 2 == 0 else staged[::-1]:
                        home = work / f"cache-{round_}-{tool}"
                        env = {**base, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub")}
                        env |= {"BENCH_DEVICE": args.staged, "BENCH_HF_CACHE": cache}
                        got = _run("staged", env)
                        times.setdefault(tool, []).append(got["seconds"])
                        if cache == "1":
                            staged_committed.append(got["committed"])
                        print(f"round {round_ + 1}: {tool} {got['seconds']:.2f} s", file=sys.stderr)
                warm_env = {
                    **base,
                    "HF_HOME": str(caches["ours"]),
                    "HF_HUB_CACHE": str(caches["ours"] / "hub"),
                }
                warm = ["aioloader-warm", "safetensors-warm", "aioloader-local"]
                # Rotated round by round: on this VM the first process to allocate a
                # GiB after another freed it pays for the host handing memory back.
                for tool in warm[round_ % 3 :] + warm[: round_ % 3]:
                    got = _run(tool, warm_env, warm=caches["ours"] / "hub")
                    times[tool].append(got["seconds"])
                    print(f"round {round_ + 1}: {tool} {times[tool][-1]:.2f} s", file=sys.stderr)
        finally:
            assert hub.stdin is not None
            hub.stdin.close()
            hub.wait(timeout=30)
    from importlib.metadata import version

    hub_version = version("huggingface_hub")
    try:
        import hf_xet  # noqa: F401

        xet = "installed (the local Hub serves plain HTTP, not Xet)"
    except ImportError:
        xet = "not installed"
    print(
        f"model: {nbytes / (1 << 20):.0f} MiB in {args.shards} shards, {args.repeat} rounds, "
        f"storage host: {args.storage}"
    )
    print(f"hf_transfer: not used by huggingface_hub {hub_version}; hf_xet: {xet}")
    median = {tool: statistics.median(values) for tool, values in times.items()}
    rows = [
        ("cold: snapshot_download + load_file", "snapshot-then-load", "snapshot-then-load"),
        ("cold: aioloader hf:// (dict)", "aioloader-cold", "snapshot-then-load"),
        ("warm: safetensors from the snapshot", "safetensors-warm", "safetensors-warm"),
        ("warm: aioloader hf:// (HF cache)", "aioloader-warm", "safetensors-warm"),
        ("warm: aioloader on the snapshot folder", "aioloader-local", "safetensors-warm"),
    ]
    print(f"{'row':42} {'median s':>9} {'GB/s':>6} {'speed-up':>9}")
    for label, tool, against in rows:
        seconds = median[tool]
        print(
            f"{label:42} {seconds:9.2f} {nbytes / seconds / 1e9:6.2f} "
            f"{median[against] / seconds:8.2f}x"
        )
    print(
        f"{'cold: aioloader until its HF cache is written':42} {statistics.median(committed):9.2f}"
    )
    if args.staged:
        for tool in ("staged-cache", "staged-nocache"):
            seconds = median[tool]
            print(f"{'cold staged (' + args.staged + '): ' + tool:42} {seconds:9.2f} "
                  f"{nbytes / seconds / 1e9:6.2f}")  # fmt: skip
        written = statistics.median(staged_committed)
        print(f"{'cold staged: until its HF cache is written':42} {written:9.2f} "
              f"{written / median['staged-cache']:8.2f}x its load")  # fmt: skip
    print(
        "warm hf:// against aioloader on the folder: "
        f"{median['aioloader-local'] / median['aioloader-warm']:.2f}x"
    )
    # Round by round: the tools of one round run back to back (see bench/stats.py).
    for label, ours, theirs in (
        ("cold hf:// / snapshot-then-load", "aioloader-cold", "snapshot-then-load"),
        ("warm hf:// / aioloader on the folder", "aioloader-warm", "aioloader-local"),
        ("staged with the HF cache / without", "staged-cache", "staged-nocache"),
    ):
        if not times.get(ours):
            continue
        logs = [math.log(t / o) for o, t in zip(times[ours], times[theirs], strict=True)]
        paired = geometric_interval(logs)
        if paired is not None:
            mean, low, high, rounds = paired
            print(
                f"{label}, round by round over {rounds} rounds (speed, geometric mean "
                f"[95% interval]): {mean:.2f} [{low:.2f}, {high:.2f}]"
            )


if __name__ == "__main__":
    main()
