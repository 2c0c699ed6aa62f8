"""One host copy per node: N replicas on one Ray node with ``aioloader.ray.load_shared``
against N replicas that each ``load_model`` alone; with ``--preload``, the origin bytes
of ``aioloader.ray.preload`` on a local cluster of ``--nodes`` nodes, sharing one
download through the swarm against every node pulling alone (``share=False``), then
those of ``load_shared`` from one actor per node at once, the same two ways.

    bash scripts/ray_setup.sh && .venv-ray/bin/python scripts/ray_bench.py [--size-mib 512]
    .venv-ray/bin/python scripts/ray_bench.py --preload [--nodes 3] [--size-mib 512]

A one-node local Ray cluster; the model is served by a loopback HTTP server (the
test suite's), which counts the bytes it sends. For 1 and 4 replicas, each way:
bytes sent, and the replicas' summed RSS, PSS and USS (private memory) from
/proc/<pid>/smaps_rollup while they hold the tensors. PSS counts shared pages
once across the processes that map them, so the summed PSS is what the node
really spends (the holder actor's own share is listed apart).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray
import torch
from safetensors.torch import save_file

import aioloader
from aioloader.ray import load_shared, release_shared
from aioloader.ray.shared import _holder_key, _holder_name
from tests.servers import FaultyHttpServer

MiB = 1 << 20


def memory(pid: int | None = None) -> dict[str, int]:
    """Rss, Pss and USS of a process, in bytes."""
    where = f"/proc/{pid or 'self'}/smaps_rollup"
    fields = {}
    for line in Path(where).read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) * 1024
    uss = fields["Private_Clean"] + fields["Private_Dirty"]
    return {
        "rss": fields["Rss"], "pss": fields["Pss"], "uss": uss,
        "pss_anon": fields.get("Pss_Anon", 0), "pss_shmem": fields.get("Pss_Shmem", 0),
        "pss_file": fields.get("Pss_File", 0),
    }  # fmt: skip


@ray.remote(num_cpus=0)
class Replica:
    async def shared(self, url: str) -> dict[str, int]:
        self.tensors = await load_shared(url, cache_dir=False)
        return memory()

    async def alone(self, url: str) -> dict[str, int]:
        self.tensors = await aioloader.load_model(url, cache_dir=False)
        return memory()

    async def cached(self, url: str, folder: str, share: bool | None) -> int:
        self.tensors = await load_shared(url, cache_dir=folder, share=share)
        return len(self.tensors)


@ray.remote(num_cpus=0)
def holder_memory(name: str) -> dict[str, int]:
    import os

    actor = ray.get_actor(name, namespace="aioloader")
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    return memory(pid)


def preload_bench(size_mib: int, count: int) -> None:
    """Origin bytes of a cold preload on ``count`` nodes, sharing and alone, and of a
    second preload; each node its own cache folder."""
    from ray.cluster_utils import Cluster

    from aioloader.ray import preload
    from tests.helpers import write_sharded

    with tempfile.TemporaryDirectory() as tmp, FaultyHttpServer(Path(tmp) / "www") as server:
        gen = torch.Generator().manual_seed(0)
        tensors = {f"w.{i:04d}": torch.randn(4 * MiB // 4, generator=gen)
                   for i in range(size_mib // 4)}  # fmt: skip
        index = write_sharded(Path(tmp) / "www" / "m", tensors, shards=4)
        del tensors
        size = sum(p.stat().st_size for p in index.parent.iterdir())
        url = server.url_for("m/model.safetensors.index.json")
        nodes = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "include_dashboard": False},
        )
        for _ in range(count - 1):
            nodes.add_node(num_cpus=1)
        ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
        print(f"model {size / MiB:.0f} MiB in 4 shards; {count} local Ray nodes")
        print("way      run     origin MiB  x model  from peers MiB  seconds")
        for way, share in (("shared", None), ("alone", False)):
            folder = f"{tmp}/{way}-{{node_id}}"
            for run in ("cold", "again"):
                server.reset_counters()
                started = time.perf_counter()
                results = preload(url, cache_dir=folder, share=share)
                seconds = time.perf_counter() - started
                failed = [r for r in results if not r.ok]
                peers = sum(r.from_peers for r in results)
                print(
                    f"{way:8s} {run:6s} {server.bytes_sent / MiB:11.1f} "
                    f"{server.bytes_sent / size:8.3f} {peers / MiB:15.1f} {seconds:8.1f}"
                    + (f"  FAILED: {failed}" if failed else ""),
                    flush=True,
                )
        shared_bench(server, url, size, tmp)
        ray.shutdown()
        nodes.shutdown()


def shared_bench(server: FaultyHttpServer, url: str, size: int, tmp: str) -> None:
    """Origin bytes of ``load_shared`` from one actor on every node at once, sharing
    through the nodes' agents and alone; then again, the holders released."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from aioloader.ray import stop_agents

    print("load_shared, one actor per node at once")
    for way, share in (("shared", None), ("alone", False)):
        folder = f"{tmp}/ls-{way}-{{node_id}}"
        replicas = [
            Replica.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote()
            for n in ray.nodes()
            if n["Alive"]
        ]
        for run in ("cold", "again"):
            server.reset_counters()
            started = time.perf_counter()
            ray.get([r.cached.remote(url, folder, share) for r in replicas])
            seconds = time.perf_counter() - started
            print(
                f"{way:8s} {run:6s} {server.bytes_sent / MiB:11.1f} "
                f"{server.bytes_sent / size:8.3f} {'':15s} {seconds:8.1f}",
                flush=True,
            )
            release_shared(url, cache_dir=folder)
        for r in replicas:
            ray.kill(r)
    stop_agents()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--preload", action="store_true", help="preload's origin bytes")
    parser.add_argument("--nodes", type=int, default=3, help="with --preload")
    args = parser.parse_args()
    print(f"command: {' '.join(sys.orig_argv)}")
    if args.preload:
        preload_bench(args.size_mib, args.nodes)
        return 0
    with tempfile.TemporaryDirectory() as tmp, FaultyHttpServer(Path(tmp)) as server:
        gen = torch.Generator().manual_seed(0)
        tensors = {f"w.{i:04d}": torch.randn(4 * MiB // 4, generator=gen)
                   for i in range(args.size_mib // 4)}  # fmt: skip
        save_file(tensors, str(Path(tmp) / "model.safetensors"))
        del tensors
        url = server.url_for("model.safetensors")
        size = (Path(tmp) / "model.safetensors").stat().st_size
        ray.init(num_cpus=2, object_store_memory=2 * size + 256 * MiB, include_dashboard=False)
        node = ray.get_runtime_context().get_node_id()
        print(f"model {size / MiB:.0f} MiB; one Ray node")
        print("replicas  way     sent MiB  RSS MiB  PSS MiB  USS MiB   (replicas summed)")
        for count in (1, 4):
            for way in ("alone", "shared"):
                replicas = [Replica.remote() for _ in range(count)]
                ray.get([r.__ray_ready__.remote() for r in replicas])
                server.reset_counters()
                started = time.perf_counter()
                call = (lambda r: r.shared.remote(url)) if way == "shared" else (
                    lambda r: r.alone.remote(url))  # fmt: skip
                got = ray.get([call(r) for r in replicas])
                seconds = time.perf_counter() - started
                rss, pss, uss = (sum(g[k] for g in got) / MiB for k in ("rss", "pss", "uss"))
                line = (
                    f"{count:8d}  {way:6s} {server.bytes_sent / MiB:9.0f} {rss:8.0f} {pss:8.0f} "
                    f"{uss:8.0f}   {seconds:.1f} s"
                )
                if way == "shared":
                    held = ray.get(
                        holder_memory.remote(
                            _holder_name(_holder_key(url, {"cache_dir": False}), node)
                        )
                    )
                    line += (
                        f"; holder: PSS {held['pss'] / MiB:.0f} MiB (anonymous "
                        f"{held['pss_anon'] / MiB:.0f}, shared memory "
                        f"{held['pss_shmem'] / MiB:.0f}, files {held['pss_file'] / MiB:.0f})"
                    )
                print(line, flush=True)
                for r in replicas:
                    ray.kill(r)
                if way == "shared":
                    release_shared(url)
                time.sleep(1.0)
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
