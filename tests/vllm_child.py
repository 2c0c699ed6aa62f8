"""Runs vLLM in the venv made by scripts/vllm_setup.sh, for tests/test_vllm.py and the benchmark.

    python tests/vllm_child.py SPEC.json OUT.json

SPEC: ``{"model": DIR, "texts": [...], "runs": [{"name", "load_format", "extra"}]}``;
a run may name a ``"model"`` of its own.
Each run starts an engine (a pooling model, on the CPU), embeds the texts and
records the embeddings, or the error that stopped it. OUT gets ``{"runs": {name:
{...}}}``; each run's log lines follow a line ``MARK + name`` on stdout (vLLM's
own "Loading weights took ... seconds" is among them). vLLM runs in
this process (no engine subprocess), so a loader's exception arrives here as it
was raised.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from typing import Any

MARK = "=== aioloader-vllm-child run: "
SPENT: list[float] = []  # load_weights times, when the spec asks for them


def time_load_weights(spent: list[float]) -> None:
    """Time every loader's ``load_weights`` the same way (the benchmark's figure).

    vLLM logs "Loading weights took" for its default loader (and aioloader does too),
    but not for every loader; this times them all alike.
    """
    import vllm.model_executor.model_loader as loaders

    import aioloader.vllm

    aioloader.vllm.register()
    table = loaders._LOAD_FORMAT_TO_MODEL_LOADER
    for cls in set(table.values()):
        original = cls.__dict__.get("load_weights")
        if original is None:
            continue

        def timed(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent.append(time.perf_counter() - started)

        cls.load_weights = timed


def run_one(model: str, texts: list[str], run: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM

    SPENT.clear()
    # vLLM logs to stdout: the parent splits it at these marks to find each run's lines.
    print(MARK + run["name"], flush=True)
    started = time.perf_counter()
    llm = None
    try:
        llm = LLM(
            model=model,
            runner="pooling",
            dtype="float32",
            enforce_eager=True,
            max_model_len=256,
            kv_cache_memory_bytes=256 * 1024**2,
            load_format=run["load_format"],
            model_loader_extra_config=run.get("extra") or {},
            seed=0,
        )
        engine_seconds = time.perf_counter() - started
        outputs = llm.embed(texts)
        return {
            "ok": True,
            "embeddings": [list(map(float, o.outputs.embedding)) for o in outputs],
            "engine_seconds": engine_seconds,
            "load_weights_seconds": list(SPENT),
        }
    except Exception as exc:
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    finally:
        del llm
        gc.collect()


def main() -> int:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    if spec.get("time_weights"):
        time_load_weights(SPENT)
    results = {
        run["name"]: run_one(run.get("model", spec["model"]), spec["texts"], run)
        for run in spec["runs"]
    }
    with open(sys.argv[2], "w") as fh:
        json.dump({"runs": results}, fh)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())
