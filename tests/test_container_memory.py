"""The container's memory ceiling, and the staging budget derived from it, refused above it."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioloader import ConfigError, Limits, Loader, load_model
from aioloader.runtime import container_memory
from aioloader.runtime.container_memory import MemoryLimit, detect_memory_limit, memory_limit
from aioloader.settings.values import parse_size, staging_budget

from .helpers import assert_matches_files, random_tensors, write_file
from .test_settings_rows import _files_opened

GiB = 1 << 30


def _tree(tmp_path: Path, files: dict[str, str], proc: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc_file = tmp_path / "proc_cgroup"
    proc_file.write_text(proc)
    return root, proc_file


def test_cgroup_v2_limit(tmp_path: Path) -> None:
    root, proc = _tree(
        tmp_path, {"kubepods/pod1/memory.max": f"{GiB // 2}\n"}, "0::/kubepods/pod1\n"
    )
    found = detect_memory_limit(root, proc)
    assert found.bytes == GiB // 2
    assert "cgroup v2" in found.source and "pod1/memory.max" in found.source


def test_cgroup_v2_parent_limit_wins(tmp_path: Path) -> None:
    root, proc = _tree(
        tmp_path,
        {"kubepods/memory.max": "1073741824", "kubepods/pod1/memory.max": "max"},
        "0::/kubepods/pod1\n",
    )
    found = detect_memory_limit(root, proc)
    assert found.bytes == GiB and "kubepods/memory.max" in found.source


def test_cgroup_v1_limit(tmp_path: Path) -> None:
    root, proc = _tree(
        tmp_path,
        {"memory/docker/abc/memory.limit_in_bytes": str(2 * GiB)},
        "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n",
    )
    found = detect_memory_limit(root, proc)
    assert found.bytes == 2 * GiB and "cgroup v1" in found.source


def test_v1_unlimited_falls_back_to_ram(tmp_path: Path) -> None:
    root, proc = _tree(
        tmp_path, {"memory/memory.limit_in_bytes": str(2**63 - 4096)}, "5:memory:/\n"
    )
    assert detect_memory_limit(root, proc).source == "physical RAM"


def test_default_budget_is_a_fraction_of_the_container() -> None:
    assert staging_budget(None, MemoryLimit(4 * GiB, "test")) == 4 * GiB // 8
    assert staging_budget(None, MemoryLimit(512 * GiB, "test")) == 2 * GiB
    assert Limits().staging_bytes == staging_budget(None, detect_memory_limit())


def test_limit_above_container_is_refused() -> None:
    # The article's failure: a 40 GB buffer in a 32 GiB container gets OOM-killed.
    with pytest.raises(ConfigError) as info:
        staging_budget("40GB", MemoryLimit(32 * GiB, "cgroup v2 /x/memory.max"))
    message = str(info.value)
    assert "OOM" in message and "/x/memory.max" in message and "--memory-limit 16GiB" in message
    # Limits reads this process's own ceiling when a load asks for the budget, and
    # refuses the same way.
    too_much = Limits(memory_limit=detect_memory_limit().bytes)
    with pytest.raises(ConfigError, match="OOM"):
        too_much.staging_bytes  # noqa: B018


def test_explicit_limit_below_container_is_kept() -> None:
    assert staging_budget("16GiB", MemoryLimit(32 * GiB, "test")) == 16 * GiB
    assert Limits(memory_limit="1MiB").staging_bytes == 1 << 20


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("16MiB", 16 << 20), ("2G", 2 * 10**9), ("1.5GiB", int(1.5 * GiB)), (7, 7)],
)
def test_parse_size(text: str | int, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["lots", "-1", "16 parsecs"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(bad)


@pytest.mark.parametrize(
    "kwargs", [{"concurrency": 0}, {"concurrency": 5000}, {"chunk_size": 100}, {"memory_limit": 10}]
)
def test_bad_limits(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Limits(**kwargs)  # type: ignore[arg-type]


def _reads_the_ceiling(opened: list[str]) -> list[str]:
    return [p for p in opened if p.startswith(("/sys/fs/cgroup", "/proc/self/cgroup"))]


async def test_loads_read_the_ceiling_at_most_once_in_a_while(tmp_path: Path) -> None:
    """Reading the cgroup's files took 2-3 ms, four times a load and on the event loop:
    most of a small warm load's fixed cost. Loads in a row read them once."""
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=4))
    assert_matches_files(await load_model(str(path)), path)
    with _files_opened() as opened:
        for _ in range(3):
            async with Loader() as loader:
                assert_matches_files(await loader.load(str(path)), path)
    assert _reads_the_ceiling(opened) == []


def test_the_ceiling_is_read_again_once_it_is_old(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod resized in place gets its new limit within ``FRESH_FOR`` seconds."""
    first = memory_limit()
    assert first == detect_memory_limit()
    monkeypatch.setattr(container_memory, "FRESH_FOR", 0.0)
    with _files_opened() as opened:
        assert memory_limit() == first
    assert "/proc/self/cgroup" in opened
