"""A scenario's numbers, and the table they are printed as."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .config import GiB
from .data import Dataset
from .scenarios import ceiling_of, is_remote, ours_of
from .stats import ToolResult, paired_ratio, ratio


def summarize(
    scenario: str, dataset: Dataset, results: dict[str, ToolResult], lanes: int | None = None
) -> dict[str, Any]:
    """The table's numbers; "aioloader" in the keys stands for ``ours`` (see ``ours_of``).

    ``lanes``: the cores each tool received on, in the parallel scenarios.
    """
    ours = results.get(ours_of(scenario))
    ours_median = ours.median if ours else None
    ceiling = results.get(ceiling_of(scenario))
    ceiling_median = ceiling.median if ceiling else None
    tools = {
        tool: {
            "median_gbps": r.median,
            "best_gbps": r.best,
            "first_tensor_s": r.first_tensor,
            "peak_rss_gib": r.peak_rss / GiB if r.peak_rss is not None else None,
            "cpu_s_per_gb": r.cpu_per_gb,
            "aioloader_over_tool": ratio(ours_median, r.median),
            "tool_over_ceiling": ratio(r.median, ceiling_median),
            "paired": (None if ours is None or r is ours else paired_ratio(ours, r)),
            "runs": r.runs,
            "errors": r.errors,
        }
        for tool, r in results.items()
    }
    return {
        "dataset": str(dataset.target),
        "files": len(dataset.files),
        "tensor_bytes": dataset.tensor_bytes,
        "ceiling": ceiling_of(scenario),
        "ours": ours_of(scenario),
        "aioloader_over_ceiling": ratio(ours_median, ceiling_median),
        "lanes": lanes,
        "tools": tools,
    }


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = (  # (heading, summary key); every value is printed with two decimals
    ("median GB/s", "median_gbps"),
    ("best GB/s", "best_gbps"),
    ("1st tensor s", "first_tensor_s"),
    ("peak RSS GiB", "peak_rss_gib"),
    ("CPU s/GB", "cpu_s_per_gb"),
    ("{ours}/tool", "aioloader_over_tool"),
    ("tool/{ceiling}", "tool_over_ceiling"),
)

CPU_NOTE = (
    "CPU s/GB: user+sys CPU seconds per 10^9 bytes of the worker process and its children"
    " (curl, s5cmd, fio), median"
)

SERVER_NOTE = "the server (nginx) is not measured: its CPU is not in CPU s/GB"


def format_table(scenario: str, summary: dict[str, Any]) -> str:
    size = summary["tensor_bytes"] / GiB
    names = {"ceiling": summary["ceiling"], "ours": summary["ours"]}
    headings = [heading.format(**names) for heading, _ in COLUMNS]
    widths = [len(heading) + 1 for heading in headings]

    def row(name: str, cells: Sequence[str]) -> str:
        return f"{name:<12}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=False))

    lanes = summary.get("lanes")
    across = f", received on {lanes} lanes" if lanes is not None else ""
    lines = [
        f"{scenario}  ({size:.2f} GiB of tensors in {summary['files']} file(s){across})",
        row("tool", headings),
    ]
    for tool, values in summary["tools"].items():
        cells = [_cell(values[key], ".2f") for _, key in COLUMNS]
        lines.append(row(tool, ["failed"] if values["median_gbps"] is None else cells))
    paired = [
        f"{tool} {p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}]"
        for tool, values in summary["tools"].items()
        if (p := values.get("paired")) is not None
    ]
    if paired:
        rounds = max(
            values["paired"][3] for values in summary["tools"].values() if values.get("paired")
        )
        lines.append(
            f"{summary['ours']}/tool round by round over {rounds} rounds"
            f" (geometric mean [95% interval]): " + "; ".join(paired)
        )
    over = _cell(summary["aioloader_over_ceiling"], ".2f")
    if is_remote(scenario):
        lines.append(f"{summary['ours']} / {summary['ceiling']}: {over}  ({SERVER_NOTE})")
    else:
        lines.append(f"aioloader / ceiling ({summary['ceiling']}): {over}")
    return "\n".join(lines)


SMALL, LARGE = "small-warm", "model-warm"


def fixed_costs(summaries: dict[str, dict[str, Any]]) -> str | None:
    """Each tool's fixed cost per load: what a small model takes beyond its bytes.

    The small model's median load time, less the time its bytes take at the
    tool's own median rate on the large warm model: what is left is the work a
    load does whatever its size (setup, allocation, threads, the event loop).
    None unless both scenarios ran.
    """
    small, large = summaries.get(SMALL), summaries.get(LARGE)
    if small is None or large is None:
        return None
    cells = []
    for tool, values in small["tools"].items():
        rate = large["tools"].get(tool, {}).get("median_gbps")
        if values["median_gbps"] is None or rate is None:
            continue
        seconds = small["tensor_bytes"] / (values["median_gbps"] * 1e9)
        fixed = seconds - small["tensor_bytes"] / (rate * 1e9)
        cells.append(f"{tool} {fixed * 1000:.0f} ms of {seconds * 1000:.0f} ms")
    if not cells:
        return None
    once = [
        f"{tool} {statistics.median(prepares) * 1000:.0f} ms"
        for tool, values in small["tools"].items()
        if (prepares := [r["prepare_seconds"] for r in values["runs"] if "prepare_seconds" in r])
    ]
    return (
        f"fixed cost per load ({SMALL} median time less its bytes at the tool's {LARGE}"
        " median rate): " + "; ".join(cells) + "\n"
        "once per process, before the clock (importing the tool's package, torch already"
        " imported, and preparing its load): " + "; ".join(once)
    )
