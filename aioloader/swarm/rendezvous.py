"""Highest-random-weight (rendezvous) hashing: every node ranks the nodes alike.

Each node computes, for a model's key, the same order of the nodes it knows: the
first is the one that pulls the model from the origin (the leader); when it is gone,
the next. Adding or removing a node moves only the models it led.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["ranked", "weight"]


def weight(key: str, node: str) -> int:
    """The node's weight for ``key``: the first 8 bytes of sha256(node NUL key)."""
    digest = hashlib.sha256(node.encode() + b"\0" + key.encode()).digest()
    return int.from_bytes(digest[:8], "big")


def ranked(key: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` (duplicates dropped) from the highest weight for ``key`` down; ties by name."""
    return sorted(set(nodes), key=lambda node: (-weight(key, node), node))
