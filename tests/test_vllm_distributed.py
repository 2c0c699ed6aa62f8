"""``"distributed": true`` in vLLM: the ranks of vLLM's tensor-parallel group share one read.

A two-rank vLLM engine (tensor parallel 2) on a 2-CPU machine without GPUs is out
of reach, so this runs what such an engine's workers run, as close to it as the
machine allows: real processes in .venv-vllm each set up vLLM's distributed
environment over gloo as a worker does (a ``VllmConfig`` naming the parallel sizes,
and within ``set_current_vllm_config`` the worker's ``init_worker_distributed_environment``,
which makes the world group, the tensor-parallel, pipeline and data-parallel groups
and their CPU groups), take the loader vLLM has registered for ``--load-format
aioloader`` and call its ``load_weights`` (tests/vllm_rank.py). With data parallelism
the world group spans every replica, which load on their own; with pipeline
parallelism each stage is a tensor-parallel group of its own.
Not covered: vLLM's engine starting the workers itself, and a model's own
``load_weights`` splitting the tensors among tensor-parallel ranks.

Each rank's parameters must equal ``safetensors``' reading bit for bit, and the
weights server must have sent the checkpoint about once per tensor-parallel group,
not once per rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from .helpers import write_sharded
from .servers import FaultyHttpServer

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
RANK = Path(__file__).with_name("vllm_rank.py")

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no .venv-vllm (run scripts/vllm_setup.sh)"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.update(
        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_HOST_IP="127.0.0.1",
        PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo",
    )  # fmt: skip
    out.pop("PYTEST_CURRENT_TEST", None)
    return out


def run_ranks(
    tmp: Path, world: int, extra: dict[str, Any], files: list[Path], **more: Any
) -> list[Any]:
    """Start ``world`` ranks (one with ``world=0``: no distributed setup) and wait for all;
    ``more`` goes into each rank's spec (``tp``, ``pp``; ``load``: the ranks that load)."""
    port = free_port()
    procs = []
    loading = more.pop("load", None)
    for rank in range(max(world, 1)):
        spec = {"rank": rank, "world": world, "port": port, "extra": extra,
                "files": [str(f) for f in files], **more}  # fmt: skip
        if loading is not None:
            spec["load"] = rank in loading
        (tmp / f"spec{rank}.json").write_text(json.dumps(spec))
        log = (tmp / f"rank{rank}.log").open("wb")
        args = [
            str(VLLM_PYTHON),
            str(RANK),
            str(tmp / f"spec{rank}.json"),
            str(tmp / f"out{rank}.json"),
        ]
        procs.append((subprocess.Popen(args, stdout=log, stderr=log, env=env(), cwd=tmp), log))
    results = []
    try:
        for rank, (proc, log) in enumerate(procs):
            code = proc.wait(timeout=300)
            log.close()
            text = (tmp / f"rank{rank}.log").read_text(errors="replace")
            assert code == 0, text[-5000:]
            results.append(json.loads((tmp / f"out{rank}.json").read_text()))
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return results


def checkpoint(folder: Path) -> tuple[list[Path], int]:
    """32 MiB in 4 files: large enough that every rank's probes of every file's head
    (256 KiB each, 2 MiB a rank in all) stay well apart from a whole checkpoint's bytes."""
    gen = torch.Generator().manual_seed(7)
    tensors = {f"w{i:02d}": torch.randn(1024 * 1024, generator=gen) for i in range(8)}
    tensors["bf16"] = torch.randn(4096, generator=gen).to(torch.bfloat16)
    index = write_sharded(folder, tensors, shards=4)
    files = sorted(index.parent.glob("*.safetensors"))
    return files, sum(f.stat().st_size for f in files)


@pytest.mark.timeout(600)
def test_two_ranks_read_the_checkpoint_once(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    files, size = checkpoint(http_server.root / "m")
    url = http_server.url_for("m/model.safetensors.index.json")
    http_server.reset_counters()
    extra = {"url": url, "distributed": True, "concurrency": 2, "chunk_size": "1MiB"}
    results = run_ranks(tmp_path, 2, extra, files)
    for result in results:
        assert result["ok"], result.get("traceback")
        assert result["world_size"] == 2
        assert result["mismatched"] == []
    # One checkpoint's bytes, plus the header probes every rank makes of every file.
    assert size <= http_server.bytes_sent < 1.5 * size, (http_server.bytes_sent, size)


@pytest.mark.timeout(600)
def test_each_replica_loads_on_its_own(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    """Data parallelism, two replicas of two ranks: the world group spans both, and a
    load over it waited for the replica that loads at another time (here: never; it
    fails when that replica's ranks exit). Each replica's tensor-parallel group loads
    alone."""
    files, size = checkpoint(http_server.root / "m")
    url = http_server.url_for("m/model.safetensors.index.json")
    http_server.reset_counters()
    extra = {"url": url, "distributed": True, "concurrency": 2, "chunk_size": "1MiB"}
    results = run_ranks(tmp_path, 4, extra, files, tp=2, load={0, 1})
    for rank, result in enumerate(results):
        assert result["ok"], result.get("traceback")
        assert (result["world_size"], result["dp_size"], result["pp_size"]) == (4, 2, 1)
        assert result["tp_ranks"] == ([0, 1] if rank < 2 else [2, 3])
    for result in results[:2]:
        assert result["mismatched"] == []
    assert size <= http_server.bytes_sent < 1.5 * size, (http_server.bytes_sent, size)


@pytest.mark.timeout(600)
def test_each_pipeline_stage_loads_over_its_own_group(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """Pipeline parallelism, two stages of two ranks: each stage's tensor-parallel group
    reads the checkpoint once among its ranks; over the world group the four ranks
    would have shared one read."""
    files, size = checkpoint(http_server.root / "m")
    url = http_server.url_for("m/model.safetensors.index.json")
    http_server.reset_counters()
    extra = {"url": url, "distributed": True, "concurrency": 2, "chunk_size": "1MiB"}
    results = run_ranks(tmp_path, 4, extra, files, tp=2, pp=2)
    for rank, result in enumerate(results):
        assert result["ok"], result.get("traceback")
        assert (result["world_size"], result["dp_size"], result["pp_size"]) == (4, 1, 2)
        assert result["tp_ranks"] == ([0, 1] if rank < 2 else [2, 3])
        assert result["mismatched"] == []
    # Once per stage, plus every rank's header probes; once per rank would be 4 times.
    assert 2 * size <= http_server.bytes_sent < 3 * size, (http_server.bytes_sent, size)


@pytest.mark.timeout(600)
def test_without_the_model_parallel_groups_distributed_is_refused(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    files, _ = checkpoint(http_server.root / "m")
    url = http_server.url_for("m/model.safetensors.index.json")
    [result] = run_ranks(tmp_path, 0, {"url": url, "distributed": True}, files)
    assert not result["ok"]
    assert "ConfigError" in result["error"] and '"distributed": true' in result["error"]
