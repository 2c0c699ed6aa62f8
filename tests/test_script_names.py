"""The names of our modules that scripts and tests spell as text (an import by name, a
logger, a patch target) name modules that exist: a module moved to another room must
not leave a benchmark that fails only when it is run."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_DOTTED = re.compile(r"^aioloader(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_MADE_UP = re.compile(r"^aioloader\.tests?\.")  # loggers the tests make for themselves


def _spelled() -> list[tuple[str, str]]:
    found = []
    for folder in ("scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                text = node.value if isinstance(node, ast.Constant) else None
                if isinstance(text, str) and _DOTTED.match(text) and not _MADE_UP.match(text):
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", text))
    return found


def _exists(dotted: str) -> bool:
    """``dotted`` is a module of ours, or a name in one (``aioloader.runtime.threads.Lane``)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:end]))
        except ModuleNotFoundError:
            spec = None
        if spec is not None:
            return end >= len(parts) - 1  # at most one attribute after the module
    return False


def test_every_module_named_as_text_exists() -> None:
    missing = [f"{where}: {name}" for where, name in _spelled() if not _exists(name)]
    assert missing == []


@pytest.mark.parametrize("target", ["/models/llama", "https://host/m.safetensors"])
def test_the_benchmark_imports_what_a_load_runs(target: str) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench.tools.base import import_for_load
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    import_for_load(target)
