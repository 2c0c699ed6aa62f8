"""One tool's runs in one scenario, and how two tools' runs compare."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from .config import GB


@dataclass
class ToolResult:
    runs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def speeds(self) -> list[float]:
        return [r["bytes"] / r["seconds"] / GB for r in self.runs]

    @property
    def median(self) -> float | None:
        return statistics.median(self.speeds()) if self.runs else None

    @property
    def best(self) -> float | None:
        return max(self.speeds()) if self.runs else None

    @property
    def first_tensor(self) -> float | None:
        """The median seconds from the start of a load to its first usable tensor."""
        firsts = [r["first_tensor_seconds"] for r in self.runs if r.get("first_tensor_seconds")]
        return statistics.median(firsts) if firsts else None

    @property
    def peak_rss(self) -> int | None:
        return max((r["peak_rss"] for r in self.runs if r["peak_rss"] is not None), default=None)

    @property
    def cpu_per_gb(self) -> float | None:
        """The median CPU seconds per GB delivered."""
        return statistics.median(map(cpu_per_gb, self.runs)) if self.runs else None


def cpu_per_gb(run: dict[str, Any]) -> float:
    cpu: float = run["cpu_user"] + run["cpu_system"]
    nbytes: int = run["bytes"]
    return cpu / (nbytes / GB)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


PAIRED_RESAMPLES = 4000


def paired_ratio(ours: ToolResult, other: ToolResult) -> tuple[float, float, float, int] | None:
    """Ours over other, round by round: (geometric mean, 95% low, 95% high, rounds).

    The machine's speed drifts between rounds more than the tools differ, but
    the tools of one round run back to back, so the ratio within a round
    cancels most of the drift. The interval is a percentile bootstrap over
    rounds (seeded: the same runs always print the same interval); with fewer
    than three rounds there is none to give.
    """
    theirs = {r["round"]: r for r in other.runs if "round" in r}
    logs = [
        math.log((r["bytes"] / r["seconds"]) / (o["bytes"] / o["seconds"]))
        for r in ours.runs
        if (o := theirs.get(r.get("round"))) is not None
    ]
    return geometric_interval(logs)


def geometric_interval(logs: list[float]) -> tuple[float, float, float, int] | None:
    """The geometric mean of ratios given as their logs, with its 95% percentile
    bootstrap interval (seeded) and their count; None for fewer than three."""
    if len(logs) < 3:
        return None
    draw = random.Random(0)
    means = sorted(
        statistics.fmean(draw.choices(logs, k=len(logs))) for _ in range(PAIRED_RESAMPLES)
    )
    low, high = means[int(0.025 * PAIRED_RESAMPLES)], means[int(0.975 * PAIRED_RESAMPLES) - 1]
    return math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high), len(logs)
