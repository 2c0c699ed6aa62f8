"""How long a name may be to become a file, and how to show one in a message (pure).

A listing or an index may name anything; a file system takes at most 255 bytes a
name (``NAME_MAX`` on Linux's file systems) and 4096 a path (``PATH_MAX``), counted
in the bytes of the name's UTF-8 form, not in characters (``"é"`` is two). A name
past either limit cannot be written: it is refused (or left out) by name, with the
limit it breaks, rather than failing later with the system's "File name too long"
or with a message that blames something else. Messages show such a name cut short.
"""

from __future__ import annotations

__all__ = ["MAX_PATH", "MAX_SEGMENT", "length_problem", "shown"]

MAX_SEGMENT = 255  # bytes of one name in a folder
MAX_PATH = 4096  # bytes of a whole path
_SHOWN = 60  # characters of a long name a message shows


def length_problem(name: str) -> str | None:
    """Why ``name`` (``/``-separated) is too long to be a file, or None when it is not."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_PATH:
        return f"is {size} bytes long, over the {MAX_PATH} bytes a path may have"
    for part in name.split("/"):
        part_size = len(part.encode("utf-8", "surrogatepass"))
        if part_size > MAX_SEGMENT:
            return (
                f"has a segment of {part_size} bytes ({shown(part)}), over the "
                f"{MAX_SEGMENT} bytes a file or folder name may have"
            )
    return None


def shown(name: object) -> str:
    """``name`` for a message: its ``repr``, cut short when long, with its length."""
    if not isinstance(name, str):
        return repr(name)[:_SHOWN]
    if len(name) <= _SHOWN:
        return repr(name)
    return f"{name[:_SHOWN]!r}... ({len(name)} characters)"
