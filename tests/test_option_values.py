"""Numeric settings refuse what is not a usable number, naming the setting.

NaN, infinities, negatives, bools standing in for ints, floats for counts and
endless sizes were accepted before and failed later, far from the cause (an
``OverflowError`` in the middle of a load, ``concurrency=True`` as one reader).
"""

from __future__ import annotations

import pytest

from aioloader import ConfigError, HttpOptions, Limits
from aioloader.settings.values import parse_size
from aioloader.vllm import VllmOptions

NAN, INF = float("nan"), float("inf")
BAD_SECONDS = [NAN, INF, -INF, -1, -0.5, True, "5", None, 1e300, 10**400]
BAD_COUNTS = [NAN, INF, 0, -1, True, False, 2.0, "4", None]


@pytest.mark.parametrize("name", ["backoff", "backoff_max", "stall_timeout", "connect_timeout"])
@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
def test_http_seconds(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"^{name} must be"):
        HttpOptions(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [*BAD_SECONDS, 0], ids=repr)
def test_speed_window_and_deadline(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^speed_window must be"):
        HttpOptions(speed_window=value)  # type: ignore[arg-type]
    if value is not None:  # None is "no deadline"
        with pytest.raises(ConfigError, match=r"^deadline must be"):
            HttpOptions(deadline=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
def test_counts(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^max_attempts must be"):
        HttpOptions(max_attempts=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^concurrency must be"):
        Limits(concurrency=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [NAN, INF, -1, True], ids=repr)
def test_min_speed(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^min_speed must be"):
        HttpOptions(min_speed=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [*BAD_COUNTS, 65, 10**6, 10**400, 4.0, "2", b"2"], ids=repr)
def test_receive_lanes(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^receive_lanes must be") as info:
        HttpOptions(receive_lanes=value)  # type: ignore[arg-type]
    assert "from 1 (the event loop's own, the default) to 64" in str(info.value)
    assert isinstance(info.value, ValueError) and len(str(info.value)) < 300


def test_receive_lanes_from_one_to_sixty_four() -> None:
    assert HttpOptions().receive_lanes == 1
    assert [HttpOptions(receive_lanes=n).receive_lanes for n in (1, 2, 64)] == [1, 2, 64]


@pytest.mark.parametrize(
    "value", [NAN, INF, 1.5, -(1 << 20), True, None, b"16MiB", "9" * 400, "9" * 400 + "TiB"]
)
@pytest.mark.parametrize("name", ["chunk_size", "memory_limit"])
def test_sizes(name: str, value: object) -> None:
    if value is None and name == "memory_limit":
        return  # None: derived from the container's limit
    with pytest.raises(ConfigError, match=f"^{name}") as info:
        Limits(**{name: value})  # type: ignore[arg-type]
    assert len(str(info.value)) < 300  # a huge value is not echoed whole


def test_usable_values_still_pass() -> None:
    http = HttpOptions(
        max_attempts=1, backoff=0, backoff_max=0.0, stall_timeout=1e6, connect_timeout=2,
        min_speed=0, speed_window=0.5, deadline=3.5,
    )  # fmt: skip
    assert http.stall_timeout == 1e6 and http.deadline == 3.5
    assert Limits(concurrency=1, chunk_size="4KiB", memory_limit="1MiB").chunk_size == 4096
    assert parse_size("16MiB") == 16 << 20 and parse_size(0) == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("stall_timeout", NAN), ("stall_timeout", INF), ("stall_timeout", -1),
        ("stall_timeout", 1e300), ("connect_timeout", NAN), ("connect_timeout", -INF),
        ("concurrency", 0), ("concurrency", -4), ("concurrency", 10**30),
        ("max_attempts", 0), ("max_attempts", -1),
        ("chunk_size", -1), ("chunk_size", "9" * 400), ("chunk_size", "lots"),
        ("memory_limit", -1), ("memory_limit", "1e9"),
    ],
)  # fmt: skip
def test_vllm_numbers_are_refused_naming_the_key(key: str, value: object) -> None:
    """As vLLM's JSON parser hands them over (it reads NaN and Infinity)."""
    with pytest.raises(ConfigError, match=f"--model-loader-extra-config: '{key}'"):
        VllmOptions.parse({key: value})
