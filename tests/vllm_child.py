"""Runs vLLM in the venv made by scripts/vllm_setup.sh, for tests/test_vllm.py and the benchmark.

    python tests/vllm_child.py SPEC.json OUT.json

SPEC: ``{"model": DIR, "texts": [...], "runs": [{"name", "load_format", "extra"}]}``.
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


def run_one(model: str, texts: list[str], run: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM

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
    results = {run["name"]: run_one(spec["model"], spec["texts"], run) for run in spec["runs"]}
    with open(sys.argv[2], "w") as fh:
        json.dump({"runs": results}, fh)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())
