"""One rank of vLLM's loader with ``"distributed": true``, in the venv of scripts/vllm_setup.sh.

    python tests/vllm_rank.py SPEC.json OUT.json

SPEC: ``{"rank", "world", "port", "extra", "files"}``, optionally ``"tp"`` (the
tensor-parallel size, default the world's) and ``"load"`` (false: set up, load
nothing). The rank sets up vLLM's own distributed environment as an engine's worker
does (``init_distributed_environment`` with gloo, which makes the world group and
its CPU group, then ``initialize_model_parallel``: with ``tp`` below the world, the
world holds several replicas, each its own tensor-parallel group), gets the loader
vLLM registered for ``--load-format aioloader`` and calls its ``load_weights`` on a
small module whose parameters are named after the checkpoint's tensors. It then
compares every parameter with ``safetensors`` reading ``files``, bit for bit. With
``"world": 0`` it skips the distributed setup (to see the refusal). OUT gets
``{"ok", "world_size", "tp_size", "mismatched", "error"}``.
"""

from __future__ import annotations

import json
import sys
import traceback
from types import SimpleNamespace
from typing import Any


def main() -> int:
    import torch
    from safetensors.torch import load_file
    from vllm.config.load import LoadConfig
    from vllm.distributed import parallel_state
    from vllm.model_executor.model_loader import get_model_loader

    import aioloader.vllm

    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    out: dict[str, Any] = {"ok": False}
    try:
        if spec["world"]:
            parallel_state.init_distributed_environment(
                world_size=spec["world"], rank=spec["rank"], local_rank=spec["rank"],
                distributed_init_method=f"tcp://127.0.0.1:{spec['port']}", backend="gloo",
            )  # fmt: skip
            out["world_size"] = parallel_state.get_world_group().world_size
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=spec.get("tp", spec["world"]), backend="gloo"
            )
            out["tp_size"] = parallel_state.get_tp_group().world_size
        if not spec.get("load", True):
            out["ok"] = True
            return _done(spec, out)
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
        config = SimpleNamespace(model=spec["extra"]["url"], model_weights=None, quantization=None)
        loader.load_weights(model, config)
        out["mismatched"] = sorted(
            n for n, t in reference.items()
            if not (model.p[n].dtype == t.dtype and torch.equal(model.p[n].view(torch.uint8),
                                                                t.view(torch.uint8)))
        )  # fmt: skip
        out["ok"] = True
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    return _done(spec, out)


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
