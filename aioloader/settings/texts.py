"""The parsers of the settings' text forms: a variable's value, a flag's argument.

Each raises ValueError in words that say what the text should be; the resolver shows them
after the variable's name, the command line (``for_flag``) after the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Literal

__all__ = [
    "addressing",
    "cache_dir",
    "for_flag",
    "integer",
    "items",
    "lanes",
    "seconds",
    "switch",
    "text",
]


def text(value: str) -> str:
    return value


def integer(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None


def lanes(value: str) -> int | str:
    if value.strip() == "auto":
        return "auto"
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number or auto") from None


def seconds(value: str) -> float:
    try:
        return float(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a number of seconds") from None


def switch(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not 0 or 1")


def cache_dir(value: str) -> str | Literal[False]:
    return value if value.strip() else False  # an empty variable: no cache


def addressing(value: str) -> str:
    if value.strip() not in ("auto", "path", "virtual"):
        raise ValueError("write auto, path or virtual")
    return value.strip()


def items(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def for_flag(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an ``argparse`` type whose errors are ``parse``'s own words: for a
    plain ValueError argparse says "invalid <function name> value"."""

    def flag_value(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return flag_value
