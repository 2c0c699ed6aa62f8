"""The shape of the package, checked: no import circles between modules or between rooms,
no arrow from a lower room up to a higher one, at most 15 modules at the root, a docstring
for every room, no module over 400 lines, ``AIOLOADER_*`` read in one place.

These read the source as text (the static import graph: an import inside a function
counts), so a lazy import cannot hide a circle.
"""

from __future__ import annotations

import ast
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

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
    "log_lines",  # the command line's log lines
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


# -- a URL parsed once, where it enters (issue 43) ----------------------------------------


def _count_calls(monkeypatch: pytest.MonkeyPatch, function: Any) -> list[Any]:
    """Every call of ``function`` from any aioloader module, by its first argument: each
    module's name for it is wrapped by one that records the argument and calls through."""
    calls: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0] if args else None)
        return function(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "aioloader":
            for attribute, value in list(vars(module).items()):
                if value is function:
                    monkeypatch.setattr(module, attribute, counted)
    return calls


def _with_calls(monkeypatch: pytest.MonkeyPatch, cls: type, method: str, calls: list[Any]) -> None:
    """``cls.method`` recording its first argument in ``calls``, then calling through."""
    original = getattr(cls, method)

    def recorded(self: Any, first: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(first)
        return original(self, first, *args, **kwargs)

    monkeypatch.setattr(cls, method, recorded)


async def test_an_hf_load_parses_its_url_once(
    hub: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Hub parser reads the model's URL once per load (``locate``, at the API's
    edge): the source takes the place it parsed, and the files it joined, as values."""
    pytest.importorskip("torch")
    import aioloader.sources.hf.source
    import aioloader.sources.stores
    from aioloader import load_model
    from aioloader.sources import auto
    from aioloader.sources.hf import url as hf_url

    from .helpers import some_big, write_sharded

    folder = tmp_path / "src"
    write_sharded(folder, some_big(1), shards=3)
    hub.commit("org/sharded", {p.name: p.read_bytes() for p in folder.iterdir()})
    assert aioloader.sources.hf.source and aioloader.sources.stores
    calls = _count_calls(monkeypatch, hf_url.parse_hf_url)
    schemes = _count_calls(monkeypatch, auto.scheme_of)
    for url in ("hf://org/sharded", "hf://org/sharded@main/"):
        for _ in range(2):  # cold, then warm from the hub cache (warm_start.py)
            calls.clear()
            schemes.clear()
            assert len(await load_model(url)) == len(some_big(1))
            assert calls.count(url) == 1, calls
            assert calls == [url], calls  # nor any file of it, joined by the source
            assert schemes.count(url) == 1, schemes  # its scheme read once too


def _allow_list_urls() -> list[str]:
    """Every URL spelling the allow-list's tests use, allowed or refused."""
    from . import test_daemon_allow, test_daemon_hf

    found: list[str] = []
    for test in (
        test_daemon_allow.test_allowed,
        test_daemon_allow.test_refused,
        test_daemon_allow.test_check_url_refuses_bypasses,
        test_daemon_hf.test_hf_urls_inside,
        test_daemon_hf.test_hf_urls_outside,
    ):
        for mark in test.pytestmark:  # type: ignore[attr-defined]
            if mark.name == "parametrize":
                found += [v if isinstance(v, str) else v[0] for v in mark.args[1]]
    return list(dict.fromkeys(found))


async def test_the_allow_list_judges_what_the_fetch_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For every URL the allow-list's tests spell, a POST parses it once: the Location
    the allow-list judged is the very object the download then fetches."""
    import aiohttp

    from aioloader.cache.model_cache import ModelCache
    from aioloader.daemon.allow import AllowList
    from aioloader.daemon.config import DaemonConfig
    from aioloader.daemon.server import Server
    from aioloader.sources.hf import url as hf_url
    from aioloader.sources.stores import Location

    from . import test_daemon_allow, test_daemon_hf

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no fetch leaves this machine
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    prefixes = test_daemon_allow.ALLOW.prefixes + test_daemon_hf.HUB.prefixes
    judged: list[Any] = []
    fetched: list[Any] = []
    _with_calls(monkeypatch, AllowList, "refusal", judged)
    _with_calls(monkeypatch, ModelCache, "fetch", fetched)
    parsed = _count_calls(monkeypatch, hf_url.parse_hf_url)
    config = DaemonConfig(
        host="127.0.0.1", port=0, cache_dir=tmp_path / "cache", no_auth=True,
        allow_prefixes=prefixes, max_downloads=1000, grace_period=1.0,
    )  # fmt: skip
    server = Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve())
    try:
        while server.port is None:
            assert not serving.done(), serving.result()
            await asyncio.sleep(0.01)
        api = f"http://127.0.0.1:{server.port}/v1/models"
        accepted = 0
        async with aiohttp.ClientSession() as client:
            for url in _allow_list_urls():
                judged.clear()
                fetched.clear()
                parsed.clear()
                async with client.post(api, json={"url": url}) as response:
                    status = response.status
                # The str ones are the running fetches' requests (their url_policy).
                posted = [j for j in judged if not isinstance(j, str)]
                if status not in (202, 403):  # refused before any check (a 400)
                    assert posted == [] and fetched == [], url
                    continue
                assert len(posted) == 1, (url, judged)
                (where,) = posted
                assert isinstance(where, Location) and where.first == url.strip(), url
                assert parsed.count(url) == (1 if url[:5].lower() == "hf://" else 0), url
                if status == 403:
                    continue
                accepted += 1
                for _ in range(500):
                    if fetched:
                        break
                    await asyncio.sleep(0.01)
                assert fetched and fetched[0] is where, url
        assert accepted >= 20
    finally:
        server.request_exit()
        await serving


def test_a_passing_tests_folders_do_not_outlive_it(request: pytest.FixtureRequest) -> None:
    """The suite writes about 13 GB of models, caches and logs in all: kept to the end,
    they filled a CI machine's disk (2026-12-07). A passing test's tmp_path goes as it
    ends; only a failing test's stays, to be read."""
    assert request.config.getini("tmp_path_retention_policy") == "failed"
    assert int(request.config.getini("tmp_path_retention_count")) <= 1
