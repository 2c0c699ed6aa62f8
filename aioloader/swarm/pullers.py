"""The pullers a node publishes in its manifest while it fetches (``split``): who pulls
the model from the origin in its deal, taken by the nodes that deal after it (deal.py).
A peer's list is checked before anything uses it: a lie refuses its manifest whole."""

from __future__ import annotations

import re

__all__ = ["MAX_SPLIT", "parse_split"]

MAX_SPLIT = 4096
"""Nodes one manifest's ``split`` may name."""
_NODE = re.compile(r"^[0-9a-f]{1,64}$")


def parse_split(raw: object) -> tuple[str, ...]:
    """A manifest's ``split``: node ids of at most 64 hex digits, in node order, none
    twice, 1 to ``MAX_SPLIT`` of them; () where absent. ValueError says what is wrong."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_SPLIT:
        raise ValueError(f"split is not a list of 1 to {MAX_SPLIT} node ids")
    for i, node in enumerate(raw):
        if not isinstance(node, str) or not _NODE.match(node):
            raise ValueError(f"split[{i}] is not a node id (at most 64 hex digits)")
    if raw != sorted(set(raw)):
        raise ValueError("split is not in node order, or names a node twice")
    return tuple(raw)
