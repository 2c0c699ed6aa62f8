"""The shape of the package, checked: no import circles between modules or between rooms,
no arrow from a lower room up to a higher one, at most 15 modules at the root, a docstring
for every room, no module over 400 lines, ``AIOLOADER_*`` read in one place.

These read the source as text (the static import graph: an import inside a function
counts), so a lazy import cannot hide a circle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aioloader"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its text."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from .. import errors`` depends on the module errors, not on the package
            # (whose __init__ names everything for type checkers).
            submodules = [f"{target}.{alias.name}" for alias in node.names]
            candidates = [c for c in submodules if c in MODULES] or [target]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c in MODULES and c != name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    assert _circles(GRAPH) == []


def test_sources_never_import_the_cache() -> None:
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if name.startswith("aioloader.sources")
        for target in targets
        if target.startswith("aioloader.cache")
    )
    assert upward == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_400_lines(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines; split it by concept"


_READS_ENVIRONMENT = re.compile(r"(os\.environ|getenv|environ\.get|environ\[)")


def test_aioloader_variables_are_read_in_one_place() -> None:
    """Every ``AIOLOADER_*`` variable is a row of the settings table, read by its resolver."""
    readers = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in MODULES.values()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "AIOLOADER_" in line
        and _READS_ENVIRONMENT.search(line)
        and not line.lstrip().startswith(("#", '"', "'"))
    )
    assert readers == []


MAX_ROOT_MODULES = 15

#: The rooms, lowest first: a room imports only rooms before it (a module at the root is a
#: room of its own). Each package's docstring says what lives there.
ROOMS = [
    "message_filter",
    "redact",
    "errors",
    "format",  # the file format, pure
    "runtime",  # lanes, tasks, turns, pacing: how the rest runs
    "settings",  # the table, the resolver, the values, a load's options
    "reads",  # read planning and staging, pure
    "sources",  # the storage backends
    "sinks",  # what both caches share, and the Hugging Face cache's writer
    "cache",  # the node cache
    "devices",  # the destinations
    "ranks",  # who reads what
    "load",  # the load itself
    "swarm",  # the daemons' sharing, on top of the node cache
    "daemon",
    "fetch",  # aioloader fetch SRC DEST
    "api",
    "__init__",
    "cli",
    "__main__",
    "vllm_patches",
    "vllm",
    "ray",
]


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


ROOM_GRAPH: dict[str, set[str]] = {}
for _name, _targets in GRAPH.items():
    ROOM_GRAPH.setdefault(_room(_name), set()).update(
        _room(t) for t in _targets if _room(t) != _room(_name)
    )


def test_every_room_has_its_place() -> None:
    assert sorted(ROOM_GRAPH) == sorted(ROOMS)


def test_no_circles_between_rooms() -> None:
    assert _circles(ROOM_GRAPH) == []


def test_no_arrow_runs_back_up() -> None:
    place = {room: i for i, room in enumerate(ROOMS)}
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if place[_room(target)] > place[_room(name)]
    )
    assert upward == []


def test_the_root_is_not_a_hallway() -> None:
    root = [path.name for path in PACKAGE.glob("*.py")]
    assert len(root) <= MAX_ROOT_MODULES, sorted(root)


@pytest.mark.parametrize("room", sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")))
def test_every_room_says_what_lives_there(room: str) -> None:
    tree = ast.parse((PACKAGE / room / "__init__.py").read_text())
    assert ast.get_docstring(tree), f"aioloader/{room}/__init__.py has no docstring"
