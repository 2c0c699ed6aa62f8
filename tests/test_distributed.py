"""``group=``: N real processes (spawned, gloo on 127.0.0.1) load one model together.

Each rank compares every tensor it ends with, bit for bit, with
``safetensors.torch.load_file`` of the same files, and reports how many bytes it
read itself (``LoadReport.own_bytes``); the HTTP server counts what it sent in all.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from aioloader.ranks.exchange import split_by_bytes
from aioloader.reads.plan import Read, Span

from .helpers import write_sharded
from .servers import FaultyHttpServer, MotoS3Server

TIMEOUT = 20  # the process group's, seconds: how long a rank waits for a dead one


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rank_main(rank: int, world: int, port: int, job: dict[str, Any], out: str) -> None:
    """One rank: join the group, load through it, check, write what happened."""
    import asyncio
    import datetime

    import torch.distributed as dist
    from safetensors.torch import load_file

    from aioloader import Loader, split_rows

    for key, value in job.get("env", {}).items():
        os.environ[key] = value
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=job.get("group_timeout", TIMEOUT)),
    )  # fmt: skip
    result: dict[str, Any] = {"rank": rank}
    started = time.monotonic()
    try:
        url = job.get("urls", {}).get(str(rank), job["url"])
        selection = job.get("tensors", {}).get(str(rank))
        prefix = job.get("split_rows")  # tensors cut to this rank's rows
        exchange_threads: set[str] = set()  # seen while tensors arrive
        rows = None if prefix is None else split_rows(rank, world, lambda n: n.startswith(prefix))

        async def load() -> Any:
            async with Loader(group=dist.group.WORLD, **job.get("loader", {})) as loader:
                got = {}
                async with loader.stream(url, tensors=selection, rows=rows) as stream:
                    async for name, tensor in stream:
                        got[name] = tensor
                        exchange_threads.update(_exchange_threads())
                        if job.get("die") == rank:
                            os._exit(3)  # a rank that crashes mid-load
                        if job.get("cancel") == rank:
                            asyncio.current_task().cancel()  # type: ignore[union-attr]
                return got, stream.report

        got, report = asyncio.run(load())
        reference: dict[str, torch.Tensor] = {}
        for path in job["files"]:
            reference.update(load_file(path))
        for name, tensor in reference.items():
            if prefix is not None and name.startswith(prefix):
                share = tensor.shape[0] // world
                reference[name] = tensor[rank * share : (rank + 1) * share]
        assert got.keys() == reference.keys(), "different tensor names"
        wrong = [n for n, t in reference.items() if not _same_bits(got[n], t)]
        result.update(ok=not wrong, wrong=wrong, own_bytes=report.own_bytes, bytes=report.bytes)
        result.update(exchange_threads=sorted(exchange_threads), threads_left=_exchange_threads())
    except Exception as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        result.update(ok=False, error="cancelled")
    result["seconds"] = time.monotonic() - started
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _exchange_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aioloader-exchange")]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8))
    )


def run_ranks(
    world: int, job: dict[str, Any], tmp: Path, deadline: float = 120
) -> list[dict[str, Any]]:
    """Run ``job`` on ``world`` ranks; fail the test if they are not all done within
    ``deadline`` seconds (killing them), e.g. well before the group's timeout."""
    for old in tmp.glob("rank*.json"):
        old.unlink()
    port = free_port()
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=rank_main, args=(rank, world, port, job, str(tmp)))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    until = time.monotonic() + deadline
    for proc in procs:
        proc.join(max(0.0, until - time.monotonic()))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    if hung:
        pytest.fail(f"rank(s) {hung} of {world} hung for {deadline} s")
    results = []
    for rank in range(world):
        path = tmp / f"rank{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {"rank": rank})
    return results


def model(folder: Path, shards: int, seed: int = 0) -> list[Path]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {f"layer.{i:02d}.weight": torch.randn(256, 1024, generator=gen) for i in range(12)}
    tensors["embed"] = torch.randn(300, 512, generator=gen).to(torch.bfloat16)
    tensors["scale"] = torch.tensor(3, dtype=torch.int64)
    index = write_sharded(folder, tensors, shards=shards)
    return sorted(index.parent.glob("*.safetensors"))


def http_job(server: FaultyHttpServer, files: list[Path]) -> dict[str, Any]:
    """The ranks' job for ``model(server.root / "m", ...)`` served by ``server``."""
    return {
        "url": server.url_for("m/model.safetensors.index.json"),
        "files": [str(p) for p in files],
        "loader": {"chunk_size": "128KiB", "cache_dir": False},
    }


# -- the pure part -------------------------------------------------------------------------


def test_shares_are_consecutive_and_balanced_by_bytes() -> None:
    span = Span(0, "f", 0, 100 << 20, ())
    reads = [Read(span, i << 20, (i + 1) << 20, ()) for i in range(100)]
    for ranks in (1, 2, 3, 4, 7):
        owners = split_by_bytes(reads, ranks)
        assert owners == sorted(owners)  # consecutive
        counts = [owners.count(r) for r in range(ranks)]
        assert max(counts) - min(counts) <= 1, counts


# -- real ranks ----------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_share_local_files(tmp_path: Path, world: int) -> None:
    files = model(tmp_path / "m", shards=3)
    job = {
        "url": str(tmp_path / "m"),
        "files": [str(p) for p in files],
        "loader": {"chunk_size": "64KiB"},
    }
    results = run_ranks(world, job, tmp_path)
    assert all(r.get("ok") for r in results), results
    # The broadcasts run in the load's own named thread, closed with the load.
    assert all(r["exchange_threads"] and not r["threads_left"] for r in results), results
    total = results[0]["bytes"]
    own = [r["own_bytes"] for r in results]
    assert sum(own) >= total and sum(own) < total + world * 3 * 8192  # each byte read once
    assert max(own) < total / world * 1.5, own


def test_ranks_share_an_http_model_and_fetch_it_once(tmp_path: Path) -> None:
    world = 2
    with FaultyHttpServer(tmp_path / "www") as server:
        files = model(server.root / "m", shards=2)
        job = http_job(server, files)
        results = run_ranks(world, job, tmp_path)
        sent = server.bytes_sent
    assert all(r.get("ok") for r in results), results
    size = sum(p.stat().st_size for p in files)
    # Every rank probes every file (headers), and the data crosses the network once.
    assert sent < size + world * len(files) * (256 << 10), (sent, size)
    own = [r["own_bytes"] for r in results]
    assert all(0.3 < o / results[0]["bytes"] < 0.7 for o in own), own


def test_ranks_share_an_s3_model(tmp_path: Path, moto_server: MotoS3Server) -> None:
    files = model(tmp_path / "m", shards=4, seed=1)
    moto_server.upload("dist-bucket", "m", tmp_path / "m")
    with pytest.MonkeyPatch.context() as patch:
        moto_server.set_env(patch, tmp_path)
        env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    job = {
        "url": "s3://dist-bucket/m/",
        "files": [str(p) for p in files],
        "env": env,
        "loader": {"chunk_size": "128KiB", "cache_dir": False},
    }
    results = run_ranks(4, job, tmp_path)
    assert all(r.get("ok") for r in results), results


def test_a_rank_that_cannot_open_the_model_is_named_by_every_rank(tmp_path: Path) -> None:
    files = model(tmp_path / "m", shards=2)
    job = {
        "url": str(tmp_path / "m"),
        "urls": {"1": str(tmp_path / "nowhere")},
        "files": [str(p) for p in files],
    }
    results = run_ranks(3, job, tmp_path)
    assert "NotFoundError" in results[1]["error"]
    for r in (results[0], results[2]):
        assert "DistributedError" in r["error"] and "rank 1: NotFoundError" in r["error"]
        assert r["seconds"] < TIMEOUT


def test_ranks_that_planned_different_loads_fail_at_once(tmp_path: Path) -> None:
    files = model(tmp_path / "m", shards=2)
    job = {
        "url": str(tmp_path / "m"),
        "tensors": {"1": ["embed"]},
        "files": [str(p) for p in files],
    }
    results = run_ranks(2, job, tmp_path)
    for r in results:
        assert "planned different loads" in r["error"] and r["seconds"] < TIMEOUT


def test_a_rank_whose_read_fails_is_named_by_the_others(tmp_path: Path) -> None:
    with FaultyHttpServer(tmp_path / "www") as server:
        files = model(server.root / "m", shards=2)
        # Both ranks probe both shards first; then only the second shard's owner (rank 1)
        # reads its data, and finds the object changed under it.
        server.change_after(f"m/{files[1].name}", requests=2)
        job = http_job(server, files)
        results = run_ranks(2, job, tmp_path)
    assert "ObjectChangedError" in results[1]["error"], results[1]
    assert "DistributedError" in results[0]["error"], results[0]
    assert (
        "rank 1 of 2 failed" in results[0]["error"] and "ObjectChangedError" in results[0]["error"]
    )
    assert results[0]["seconds"] < TIMEOUT


def slow_job(folder: Path, **extra: Any) -> dict[str, Any]:
    """A two-shard model read in small reads one at a time: a load long enough to stop."""
    files = model(folder, shards=2)
    return {
        "url": str(folder),
        "files": [str(p) for p in files],
        "loader": {"chunk_size": "16KiB", "concurrency": 1},
        **extra,
    }


def test_a_rank_that_dies_fails_the_others_within_the_group_timeout(tmp_path: Path) -> None:
    job = slow_job(tmp_path / "m", die=1)
    results = run_ranks(2, job, tmp_path)
    assert not results[0]["ok"] and results[0]["seconds"] < TIMEOUT * 2 + 10, results[0]


def test_a_cancelled_rank_is_named_by_the_others(tmp_path: Path) -> None:
    """Rank 1 is cancelled at its first tensor, before its first share has gone out:
    with broadcasts in flight, rank 0 still hears it and fails at once, naming it."""
    job = slow_job(tmp_path / "m", cancel=1)
    results = run_ranks(2, job, tmp_path)
    assert results[1]["error"] == "cancelled", results[1]
    assert "DistributedError" in results[0]["error"], results[0]
    assert "rank 1 of 2 failed" in results[0]["error"] and "cancelled" in results[0]["error"]
    assert results[0]["seconds"] < TIMEOUT


def test_ranks_read_their_own_rows_and_share_the_rest(tmp_path: Path) -> None:
    """``rows=split_rows(...)`` with a group: each rank reads its rows of the split
    tensors itself (nothing of them is exchanged) and a share of the others."""
    world = 2
    with FaultyHttpServer(tmp_path / "www") as server:
        files = model(server.root / "m", shards=2)
        job = {**http_job(server, files), "split_rows": "layer."}
        results = run_ranks(world, job, tmp_path)
        sent = server.bytes_sent
    assert all(r.get("ok") for r in results), results
    size = sum(p.stat().st_size for p in files)
    layers = 12 * 256 * 1024 * 4  # the split tensors: each rank gets half of each
    shared = size - layers  # roughly: embed and scale, and the headers
    for r in results:
        assert r["bytes"] == layers // world + 300 * 512 * 2 + 8  # its rows, and the rest
        # Its own rows, and about half of what the ranks share.
        assert layers // world <= r["own_bytes"] <= layers // world + shared, r
    # The split tensors crossed the network once in all; nothing was fetched twice.
    assert sent < size + world * len(files) * (256 << 10), (sent, size)
