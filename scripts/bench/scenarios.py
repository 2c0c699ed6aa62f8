"""The tools and scenarios by name, and what each scenario is made of."""

from __future__ import annotations

from collections.abc import Sequence

TOOLS = ("aioloader", "safetensors", "runai", "preadv", "fio", "curl", "s5cmd")  # the default set
EXTRA_TOOLS = ("safetensors-pread", "direct", "direct-4k")  # on request, with --tools
# The ways model-cache loads (all of them unless --tools names some); "fill"
# is its untimed worker that fills the cache the warm-cache runs read.
CACHE_TOOLS = ("cold-remote", "warm-cache", "populate")
CACHE_FILL = "fill"
LOCAL_SCENARIOS = (
    "model-warm", "one-tensor-warm", "small-warm", "model-cold", "one-tensor-cold",
)  # fmt: skip
REMOTE_SCENARIOS = ("model-http", "one-tensor-http", "model-s3", "one-tensor-s3")
CACHE_SCENARIOS = ("model-cache",)
DEFAULT_SCENARIOS = LOCAL_SCENARIOS + REMOTE_SCENARIOS + CACHE_SCENARIOS
# On request only (--scenarios): model-http again, with every tool receiving on --lanes
# cores at once.
PARALLEL_SCENARIOS = ("model-http-parallel",)
SCENARIOS = DEFAULT_SCENARIOS + PARALLEL_SCENARIOS
# The tools that do each kind of scenario (the part of its name after the dataset; a
# kind may hold a dash, so its name is matched against these keys, never split at one).
LOCAL_TOOLS = ("aioloader", "safetensors", "safetensors-pread", "runai", "preadv")
KIND_TOOLS = {
    "warm": frozenset(LOCAL_TOOLS),
    "cold": frozenset((*LOCAL_TOOLS, "fio", "direct", "direct-4k")),
    "http": frozenset({"aioloader", "curl"}),
    "http-parallel": frozenset({"aioloader", "curl"}),
    "s3": frozenset({"aioloader", "s5cmd", "runai"}),
    "cache": frozenset(CACHE_TOOLS),
}
REMOTE_KINDS = frozenset({"http", "http-parallel", "s3", "cache"})
# The kinds whose workers receive on several cores: aioloader with receive lanes, and
# as many curl processes each fetching its share of the bytes (tools/remote.py).
PARALLEL_KINDS = frozenset({"http-parallel"})
# What aioloader is compared with first: the ceiling locally, the usual tool remotely.
REFERENCE = {
    "warm": "preadv",
    "cold": "fio",
    "http": "curl",
    "http-parallel": "curl",
    "s3": "s5cmd",
    "cache": "cold-remote",
}
# The tool in the headline ratio ("aioloader" but where named here).
OURS = {"cache": "warm-cache"}
WHOLE_FILE_TOOLS = frozenset(
    {"preadv", "direct", "direct-4k", "curl", "s5cmd"}
)  # they deliver file bytes, not tensors


def kind_of(scenario: str) -> str:
    """``warm``, ``cold``, ``http``, ``http-parallel``, ``s3`` or ``cache``: the longest
    kind that ends the name after a dash (``model-http-parallel`` is not ``parallel``)."""
    kinds = [k for k in KIND_TOOLS if scenario.endswith(f"-{k}") and len(scenario) > len(k) + 1]
    if not kinds:
        raise ValueError(f"{scenario!r} ends in no scenario kind ({', '.join(KIND_TOOLS)})")
    return max(kinds, key=len)


def dataset_of(scenario: str) -> str:
    """The name before its kind: ``model``, ``one-tensor`` or ``small``."""
    return scenario[: -len(kind_of(scenario)) - 1]


def is_remote(scenario: str) -> bool:
    return kind_of(scenario) in REMOTE_KINDS


def is_parallel(scenario: str) -> bool:
    """Whether its tools receive on ``--lanes`` cores (see ``PARALLEL_KINDS``)."""
    return kind_of(scenario) in PARALLEL_KINDS


def ceiling_of(scenario: str) -> str:
    """The tool aioloader is measured against: a ceiling locally, the usual tool remotely."""
    return REFERENCE[kind_of(scenario)]


def ours_of(scenario: str) -> str:
    """The tool measured against the ceiling: aioloader, or in model-cache warm-cache."""
    return OURS.get(kind_of(scenario), "aioloader")


def scenario_tools(scenario: str, tools: Sequence[str]) -> list[str]:
    """The tools of ``tools`` that do ``scenario``; model-cache: all its own unless some named."""
    kind = KIND_TOOLS[kind_of(scenario)]
    chosen = [t for t in tools if t in kind]
    if kind_of(scenario) == "cache" and not chosen:
        return list(CACHE_TOOLS)
    return chosen
