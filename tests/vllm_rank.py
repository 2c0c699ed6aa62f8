"""One rank of vLLM's loader with ``"distributed": true``, in the venv of scripts/vllm_setup.sh.

    python tests/vllm_rank.py SPEC.json OUT.json

SPEC: ``{"rank", "world", "port", "extra", "files"}``, optionally ``"tp"`` (the
tensor-parallel size, default the world's over ``pp``), ``"pp"`` (the pipeline-parallel
size, default 1) and ``"load"`` (false: set up, load nothing). ``rank`` and ``world``
count every rank of every replica: the world holds ``world / (tp * pp)`` data-parallel
replicas, and rank r is rank ``r % (tp * pp)`` of replica ``r // (tp * pp)``.

The rank sets up vLLM's distributed environment as an engine's worker does: a
``VllmConfig`` whose ``ParallelConfig`` names those sizes and the replica, and within
``set_current_vllm_config`` the worker's own ``init_worker_distributed_environment``
with gloo (the world group across the replicas, then ``initialize_model_parallel``'s
tensor-parallel, pipeline and data-parallel groups with their CPU groups). It gets the
loader vLLM registered for ``--load-format aioloader`` and calls its ``load_weights``
on a small module whose parameters are named after the checkpoint's tensors, then
compares every parameter with ``safetensors`` reading ``files``, bit for bit. With
``"world": 0`` it skips the distributed setup (to see the refusal). OUT gets
``{"ok", "world_size", "tp_size", "tp_ranks", "pp_size", "dp_size", "mismatched",
"error"}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any


def main() -> int:
    from vllm.config import VllmConfig, set_current_vllm_config

    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    out: dict[str, Any] = {"ok": False}
    config = VllmConfig(parallel_config=_parallel_config(spec)) if spec["world"] else VllmConfig()
    with set_current_vllm_config(config):
        try:
            _run(spec, config, out)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = traceback.format_exc()
        return _done(spec, out)


def _parallel_config(spec: dict[str, Any]) -> Any:
    """A replica's ParallelConfig, as the engine hands its workers (one host, gloo)."""
    from vllm.config import ParallelConfig

    pp = spec.get("pp", 1)
    tp = spec.get("tp", spec["world"] // pp)
    dp, rest = divmod(spec["world"], tp * pp)
    assert dp >= 1 and not rest, spec
    parallel = ParallelConfig(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp,
        data_parallel_rank=spec["rank"] // (tp * pp), data_parallel_master_ip="127.0.0.1",
        distributed_executor_backend="mp",
    )  # fmt: skip
    # With data parallelism the world group meets at the master's port, which every
    # replica must agree on (the engine's launcher hands it to them).
    parallel._data_parallel_master_port_list = []
    parallel.data_parallel_master_port = spec["port"]
    return parallel


def _run(spec: dict[str, Any], config: Any, out: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import load_file
    from vllm.config.load import LoadConfig
    from vllm.distributed import parallel_state
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    import aioloader.vllm

    if spec["world"]:
        replica = config.parallel_config.world_size  # tp * pp: one replica's ranks
        rank = spec["rank"] % replica
        # What vLLM's CPU worker sets before this call (cpu_worker.py): its shared-memory
        # communicator names its segments by it, and reads it without a default.
        os.environ.setdefault("VLLM_DIST_IDENT", str(spec["port"]))
        init_worker_distributed_environment(
            config, rank, f"tcp://127.0.0.1:{spec['port']}", local_rank=rank, backend="gloo"
        )
        out["world_size"] = parallel_state.get_world_group().world_size
        out["tp_size"] = parallel_state.get_tp_group().world_size
        out["tp_ranks"] = parallel_state.get_tp_group().ranks
        out["pp_size"] = parallel_state.get_pp_group().world_size
        out["dp_size"] = parallel_state.get_dp_group().world_size
    if not spec.get("load", True):
        out["ok"] = True
        return
    reference: dict[str, torch.Tensor] = {}
    for path in spec["files"]:
        reference.update(load_file(path))

    class Model(torch.nn.Module):
        """Parameters named ``p.<tensor>``; ``load_weights`` as vLLM's models have it."""

        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.ParameterDict(
                {n: torch.nn.Parameter(torch.zeros_like(t), requires_grad=False)
                 for n, t in reference.items()}
            )  # fmt: skip

        def load_weights(self, weights: Any) -> set[str]:
            loaded = set()
            for name, tensor in weights:
                self.p[name].data.copy_(tensor)
                loaded.add(f"p.{name}")
            return loaded

    aioloader.vllm.register()
    loader = get_model_loader(LoadConfig(load_format="aioloader",
                                         model_loader_extra_config=spec["extra"]))  # fmt: skip
    model = Model()
    model_config = SimpleNamespace(
        model=spec["extra"]["url"], model_weights=None, quantization=None
    )
    loader.load_weights(model, model_config)
    out["mismatched"] = sorted(
        n for n, t in reference.items()
        if not (model.p[n].dtype == t.dtype and torch.equal(model.p[n].view(torch.uint8),
                                                            t.view(torch.uint8)))
    )  # fmt: skip
    out["ok"] = True


def _done(spec: dict[str, Any], out: dict[str, Any]) -> int:
    from vllm.distributed import parallel_state

    if spec["world"] and parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if spec["world"]:
        parallel_state.destroy_distributed_environment()
    with open(sys.argv[2], "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
