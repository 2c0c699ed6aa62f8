"""The command line: options, then every scenario in turn, then the report."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .config import LANES, REPO_ROOT, S3_BUCKET
from .data import Dataset, prepare_data
from .machine import (
    apt_install,
    ensure_fio,
    fio_version,
    machine_info,
    print_machine,
    program_version,
    reuse_memory_env,
    worker_env,
)
from .nginx import nginx_binary, nginx_server, remote_env, s3_env, scenario_url
from .report import CPU_NOTE, fixed_costs, format_table, summarize
from .runner import CacheFolders, run_scenario
from .scenarios import (
    CACHE_TOOLS,
    DEFAULT_SCENARIOS,
    EXTRA_TOOLS,
    PARALLEL_SCENARIOS,
    SCENARIOS,
    TOOLS,
    dataset_of,
    is_parallel,
    is_remote,
    kind_of,
    scenario_tools,
)
from .tools.remote import s5cmd_binary
from .worker import worker


def _names(
    values: Sequence[str], allowed: Sequence[str], parser: argparse.ArgumentParser
) -> list[str]:
    """Space- or comma-separated names, checked against ``allowed`` and kept in its order."""
    names = {name for value in values for name in value.split(",") if name}
    unknown = names - set(allowed)
    if unknown:
        parser.error(f"unknown {', '.join(sorted(unknown))}; choose from {', '.join(allowed)}")
    return [name for name in allowed if name in names]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from . import __doc__ as overview  # the package's docstring: what is measured, and how

    parser = argparse.ArgumentParser(
        description=(overview or "").split("\n\n")[0],
        epilog=(
            f"scenarios: {', '.join(DEFAULT_SCENARIOS)} (and on request"
            f" {', '.join(PARALLEL_SCENARIOS)}); tools: {', '.join(TOOLS)} (and on request"
            f" {', '.join(EXTRA_TOOLS)}; model-cache's own: {', '.join(CACHE_TOOLS)})"
        ),
    )
    parser.add_argument(
        "--size-gib", type=float, help="model size in GiB (default 3, 1 with --quick)"
    )
    parser.add_argument(
        "--repeat", type=int, help="runs per tool and scenario (default 3, 1 with --quick)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "bench-data", help="test data folder"
    )
    parser.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS), metavar="NAME")
    parser.add_argument("--skip-cold", action="store_true", help="leave out the cold scenarios")
    parser.add_argument(
        "--skip-remote", action="store_true", help="leave out the HTTP and S3 scenarios (no nginx)"
    )
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), metavar="NAME")
    parser.add_argument(
        "--lanes",
        type=int,
        metavar="N",
        help="model-http-parallel: aioloader's receive_lanes, and how many curl processes"
        " share the bytes (default: the CPUs this process may use, at least 2)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 GiB model, 1 repetition")
    parser.add_argument(
        "--reuse-memory",
        action="store_true",
        help="every load fills memory its process has already touched (jemalloc keeping what "
        "is freed): leaves out the host's supply of fresh memory (see the docstring)",
    )
    parser.add_argument("--worker", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)  # the worker's PATH as nginx serves it
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)  # model-cache's
    args = parser.parse_args(argv)
    args.scenarios = _names(args.scenarios, SCENARIOS, parser)
    args.tools = _names(args.tools, TOOLS + EXTRA_TOOLS + CACHE_TOOLS, parser)
    if args.skip_cold:
        args.scenarios = [s for s in args.scenarios if kind_of(s) != "cold"]
    if args.skip_remote:
        args.scenarios = [s for s in args.scenarios if not is_remote(s)]
    if args.size_gib is None:
        args.size_gib = 1.0 if args.quick else 3.0
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.lanes is None:
        args.lanes = max(2, len(os.sched_getaffinity(0)))
    if args.lanes < 1:
        parser.error(f"--lanes must be at least 1, not {args.lanes}")
    return args


def remote_versions() -> dict[str, str | None]:
    return {
        "nginx": program_version(nginx_binary(), "-v"),
        "curl": program_version(shutil.which("curl"), "--version"),
        "s5cmd": program_version(s5cmd_binary(), "version"),
    }


def ensure_remote(args: argparse.Namespace, info: dict[str, Any]) -> None:
    """Install nginx (and curl) where remote scenarios need them; drop those that cannot run."""
    remote = [s for s in args.scenarios if is_remote(s)]
    if not remote:
        return
    if not apt_install("nginx", nginx_binary):
        print("  WARNING: could not install nginx; skipping " + " ".join(remote))
        args.scenarios = [s for s in args.scenarios if not is_remote(s)]
        return
    if any("curl" in scenario_tools(s, args.tools) for s in remote):
        apt_install("curl", lambda: shutil.which("curl"))
    info["remote"] = remote_versions()
    print("remote: " + "; ".join(f"{k}: {v}" for k, v in info["remote"].items()))


def lanes_env(env: dict[str, str], lanes: int | None) -> dict[str, str]:
    """``env`` with ``$BENCH_LANES`` set to ``lanes`` in a parallel scenario, and unset in
    the others, whatever this process's environment holds."""
    env = {k: v for k, v in env.items() if k != LANES}
    return env if lanes is None else {**env, LANES: str(lanes)}


def run_all(
    args: argparse.Namespace, datasets: dict[str, Dataset], env: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Every scenario in turn, with nginx running (started once) if any is remote."""
    summaries: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        endpoint = None
        if any(is_remote(s) for s in args.scenarios):
            endpoint = stack.enter_context(nginx_server(args.out))
            print(
                f"nginx: serving {args.out.resolve()} at {endpoint} (s3://{S3_BUCKET}/ at /bench/)"
            )
        for scenario in args.scenarios:
            dataset = datasets[dataset_of(scenario)]
            url, scenario_env = None, env
            if endpoint is not None and is_remote(scenario):
                url = scenario_url(scenario, dataset, args.out, endpoint)
                scenario_env = remote_env(env)
                if kind_of(scenario) == "s3":
                    scenario_env = s3_env(scenario_env, endpoint)
            lanes = args.lanes if is_parallel(scenario) else None
            scenario_env = lanes_env(scenario_env, lanes)
            caches = None
            if kind_of(scenario) == "cache":
                caches = CacheFolders(args.out)
                stack.callback(caches.close)
            results = run_scenario(
                scenario, dataset, args.tools, args.repeat, scenario_env, url, caches
            )
            summaries[scenario] = summarize(scenario, dataset, results, lanes)
            print("\n" + format_table(scenario, summaries[scenario]))
    return summaries


def terminate(signum: int, frame: Any) -> None:
    """SIGTERM as an exception, so that nginx is stopped on the way out."""
    raise SystemExit(128 + signum)


def bench(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, terminate)
    print("command:", shlex.join(sys.orig_argv))
    info = machine_info(args.out)
    if "fio" in args.tools and any(kind_of(s) == "cold" for s in args.scenarios):
        if not ensure_fio():
            args.tools.remove("fio")
        info["fio"] = fio_version()
    ensure_remote(args, info)
    print_machine(info)
    lanes = f", {args.lanes} lanes" if any(is_parallel(s) for s in args.scenarios) else ""
    print(
        f"model {args.size_gib:g} GiB, {args.repeat} run(s) per tool{lanes},"
        f" tools: {' '.join(args.tools)}"
    )
    env = worker_env()
    if args.reuse_memory:
        env = reuse_memory_env(env)
    datasets = prepare_data(args.out, args.size_gib, {dataset_of(s) for s in args.scenarios})
    summaries = run_all(args, datasets, env)

    print("\n== results (GB/s = 10^9 bytes/s)")
    print(CPU_NOTE)
    for scenario, summary in summaries.items():
        print("\n" + format_table(scenario, summary))
    fixed = fixed_costs(summaries)
    if fixed is not None:
        print("\n" + fixed)
    if args.json:
        report = {
            "command": sys.orig_argv,
            "machine": info,
            "args": _jsonable(args),
            "scenarios": summaries,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    failed = any(row["errors"] for s in summaries.values() for row in s["tools"].values())
    return 1 if failed else 0


def _jsonable(args: argparse.Namespace) -> dict[str, Any]:
    hidden = ("worker", "url", "cache_dir")
    return {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in hidden
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        tool, target = args.worker
        print(json.dumps(worker(tool, Path(target), args.url, args.cache_dir)), flush=True)
        return 0
    return bench(args)
