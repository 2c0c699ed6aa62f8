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
SCENARIOS = DEFAULT_SCENARIOS
# The tools that do each kind of scenario (the part of its name after the dataset).
LOCAL_TOOLS = ("aioloader", "safetensors", "safetensors-pread", "runai", "preadv")
KIND_TOOLS = {
    "warm": frozenset(LOCAL_TOOLS),
    "cold": frozenset((*LOCAL_TOOLS, "fio", "direct", "direct-4k")),
    "http": frozenset({"aioloader", "curl"}),
    "s3": frozenset({"aioloader", "s5cmd", "runai"}),
    "cache": frozenset(CACHE_TOOLS),
}
REMOTE_KINDS = frozenset({"http", "s3", "cache"})
# What aioloader is compared with first: the ceiling locally, the usual tool remotely.
REFERENCE = {"warm": "preadv", "cold": "fio", "http": "curl", "s3": "s5cmd", "cache": "cold-remote"}
# The tool in the headline ratio ("aioloader" but where named here).
OURS = {"cache": "warm-cache"}
WHOLE_FILE_TOOLS = frozenset(
    {"preadv", "direct", "direct-4k", "curl", "s5cmd"}
)  # they deliver file bytes, not tensors


def dataset_of(scenario: str) -> str:
    return scenario.rsplit("-", 1)[0]


def kind_of(scenario: str) -> str:
    """``warm``, ``cold``, ``http``, ``s3`` or ``cache``."""
    return scenario.rsplit("-", 1)[1]


def is_remote(scenario: str) -> bool:
    return kind_of(scenario) in REMOTE_KINDS


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
