"""The origin and the model the fleet tests share (test_fleet.py, test_swarm_trust.py):
fixtures and the two checks every fleet test makes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .fleet import Fleet, Model, Origin, write_model

__all__ = ["MIB", "identical", "model", "origin", "url_of"]

MIB = 1 << 20


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    (tmp_path / "origin").mkdir()
    with Origin(tmp_path / "origin") as server:
        yield server


@pytest.fixture
def model(origin: Origin) -> Model:
    # Shards of 8 MiB: the probe read twice per file stays within 5 % of the model.
    return write_model(origin.root / "llm", 16 * MIB, shards=2)


def url_of(origin: Origin, model: Model) -> str:
    """The URL of ``model``'s index at ``origin``."""
    return origin.url_for(model.relpath(model.index, origin.root))


def identical(fleet: Fleet, nodes: list[int], model: Model, origin: Origin) -> None:
    """Every file of ``model`` in each of ``nodes``' caches is the origin's, bit for bit."""
    wrong = [line for i in nodes for line in fleet.mismatches(i, model, origin)]
    assert wrong == []
