"""scripts/bench.py's scenario names and the parallel curl's split of the bytes: pure
parts of the benchmark, checked without running it."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
try:
    from bench.cli import lanes_env, parse_args
    from bench.config import LANES
    from bench.scenarios import (
        DEFAULT_SCENARIOS,
        KIND_TOOLS,
        SCENARIOS,
        TOOLS,
        ceiling_of,
        dataset_of,
        is_parallel,
        is_remote,
        kind_of,
        scenario_tools,
    )
    from bench.tools.remote import Part, curl_part_command, split_bytes
finally:
    sys.path.remove(str(ROOT / "scripts"))


@pytest.mark.parametrize(
    ("scenario", "dataset", "kind"),
    [
        ("model-warm", "model", "warm"),
        ("one-tensor-cold", "one-tensor", "cold"),
        ("one-tensor-http", "one-tensor", "http"),
        ("model-http", "model", "http"),
        ("model-http-parallel", "model", "http-parallel"),
        ("model-cache", "model", "cache"),
    ],
)
def test_a_scenario_is_its_dataset_and_a_whole_kind(scenario: str, dataset: str, kind: str) -> None:
    assert (dataset_of(scenario), kind_of(scenario)) == (dataset, kind)


def test_every_scenario_names_a_dataset_and_a_kind() -> None:
    for scenario in SCENARIOS:
        assert kind_of(scenario) in KIND_TOOLS
        assert dataset_of(scenario) in {"model", "one-tensor", "small"}
        assert f"{dataset_of(scenario)}-{kind_of(scenario)}" == scenario


@pytest.mark.parametrize("name", ["http", "model", "model-parallel", "model-http-"])
def test_a_name_without_a_kind_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="kind"):
        kind_of(name)


def test_model_http_parallel_is_an_opt_in_http_row_of_aioloader_and_curl() -> None:
    scenario = "model-http-parallel"
    assert scenario in SCENARIOS and scenario not in DEFAULT_SCENARIOS
    assert is_remote(scenario) and is_parallel(scenario)
    assert not is_parallel("model-http")
    assert ceiling_of(scenario) == "curl"
    assert scenario_tools(scenario, TOOLS) == ["aioloader", "curl"]


def test_lanes_default_to_the_usable_cpus_and_reach_only_parallel_workers() -> None:
    args = parse_args(["--scenarios", "model-http-parallel"])
    assert args.scenarios == ["model-http-parallel"]
    assert args.lanes >= 2
    assert parse_args(["--lanes", "3"]).lanes == 3
    assert lanes_env({LANES: "9", "A": "1"}, None) == {"A": "1"}
    assert lanes_env({"A": "1"}, 3) == {"A": "1", LANES: "3"}


def test_lanes_below_one_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--lanes", "0"])


SIZES = [[], [0], [1], [5], [3, 0, 4], [0, 0], [7, 1, 1, 9], [2, 3, 5, 7, 11, 13]]


@pytest.mark.parametrize(("sizes", "parts"), list(itertools.product(SIZES, range(1, 8))))
def test_the_split_covers_every_byte_once_in_contiguous_equal_runs(
    sizes: list[int], parts: int
) -> None:
    runs = split_bytes(sizes, parts)
    assert len(runs) == parts
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    covered = []  # each run's bytes, as offsets in the files end to end: in order, all once
    for run in runs:
        offsets = []
        for part in run:
            assert 0 <= part.first <= part.last < sizes[part.file]
            offsets += range(starts[part.file] + part.first, starts[part.file] + part.last + 1)
        covered.append(offsets)
    assert [b for run in covered for b in run] == list(range(sum(sizes)))
    lengths = [len(run) for run in covered]
    assert max(lengths) - min(lengths) <= 1


def test_the_split_of_a_model_into_two() -> None:
    assert split_bytes([10, 30], 2) == [[Part(0, 0, 9), Part(1, 0, 9)], [Part(1, 10, 29)]]


def test_the_split_refuses_no_parts() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        split_bytes([1], 0)


def test_each_range_is_a_transfer_of_its_own() -> None:
    """``--range`` applies to every URL of one transfer: ``--next`` keeps each apart."""
    command = curl_part_command(
        "curl", ["http://h/a", "http://h/b"], [Part(0, 5, 9), Part(1, 0, 3)]
    )
    first, second = " ".join(command[1:]).split(" --next ")
    assert first.endswith("--range 5-9 --output /dev/null http://h/a")
    assert second.endswith("--range 0-3 --output /dev/null http://h/b")
    assert first.startswith("--silent") and second.startswith("--silent")
    assert command[0] == "curl"
