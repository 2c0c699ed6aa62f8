"""A commit's file listing: checked as the Hub sends it, kept as huggingface_hub keeps it (pure).

A commit never changes, so neither does the list of its files. huggingface_hub
keeps each listing it fetched in the hub cache, as ``trees/<commit>.json`` in the
repository's folder::

    {"format_version": 1,
     "files": {"config.json": {"size": 519, "blob_id": "<git sha1>"},
               "model.safetensors": {"size": 1234, "blob_id": "<git sha1>",
                                     "lfs_sha256": "<sha256>", "lfs_size": 1234}}}

aioloader reads the same file, so a warm load of a commit it (or huggingface_hub)
loaded before asks the Hub nothing, and writes it when it fills the cache, so
huggingface_hub's next ``snapshot_download`` skips its listing too. A file that
does not parse, has another ``format_version`` or holds a value of the wrong kind
is ignored, and the Hub is asked instead.

Every path in a listing, from the Hub or from that file, names a file under the
snapshot's folder: a listing with a path that would reach outside it (``escapes``)
is not trusted at all. A name that is legal in git but that aioloader does not
make a file of (a backslash, a control character: ``bad_path``) stays in the
listing, so the file huggingface_hub reads back is whole, and is left out of the
files a load or a fetch sees (snapshot.py): one odd name elsewhere in a repository
does not fail the load of its weights.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ...format.names import length_problem

__all__ = ["TreeEntry", "bad_path", "dump_tree", "entry_from_json", "escapes", "parse_tree"]

FORMAT_VERSION = 1
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class TreeEntry:
    """One file of a commit.

    Attributes:
        size: its size in bytes.
        blob_id: its git blob sha1.
        lfs_sha256: the sha256 of its bytes when it is stored with LFS (weights), else None.
        xet_hash: its Xet hash when the Hub gave one (kept for huggingface_hub), else None.
    """

    size: int
    blob_id: str
    lfs_sha256: str | None = None
    xet_hash: str | None = None

    @property
    def cache_id(self) -> str:
        """The name of its blob in the hub cache: the LFS sha256, else the git sha1."""
        return self.lfs_sha256 or self.blob_id

    def to_json(self) -> dict[str, Any]:
        info: dict[str, Any] = {"size": self.size, "blob_id": self.blob_id}
        if self.lfs_sha256 is not None:
            info["lfs_sha256"] = self.lfs_sha256
            info["lfs_size"] = self.size
        if self.xet_hash is not None:
            info["xet_hash"] = self.xet_hash
        return info


def escapes(path: object) -> str | None:
    """Why ``path`` would reach outside a snapshot's folder, or name no file at all;
    None when it stays inside. A listing holding such a path is not trusted."""
    if not isinstance(path, str) or not path:
        return "it is empty or not a string"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "it is absolute, or holds an empty, '.' or '..' part"
    return None


def bad_path(path: object) -> str | None:
    """Why ``path`` cannot name a file of a snapshot, or None when it can.

    A path is relative, ``/``-separated, with no empty, ``.`` or ``..`` part
    (``escapes``), no backslash and no control character: it stays inside the
    snapshot's folder on every system huggingface_hub's cache is used on. A path
    too long to be a file (names.py) is refused with the limit it breaks.
    """
    why = escapes(path)
    if why is not None:
        return why
    assert isinstance(path, str)
    too_long = length_problem(path)
    if too_long is not None:
        return f"it {too_long}"
    if "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "it holds a backslash or a control character"
    return None


def parse_tree(data: bytes) -> dict[str, TreeEntry] | None:
    """The listing in a ``trees/<commit>.json`` file, or None for a file that is not
    one this version writes (see the module docstring)."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(document, dict) or document.get("format_version") != FORMAT_VERSION:
        return None
    files = document.get("files")
    if not isinstance(files, dict) or not files:
        return None
    entries = {}
    for path, info in files.items():
        entry = entry_from_json(info)
        if entry is None or escapes(path) is not None:
            return None
        entries[path] = entry
    return entries


def entry_from_json(info: object) -> TreeEntry | None:
    """The entry ``info`` describes (the ``files`` values above), or None when a
    value is missing or of the wrong kind: a size that is not a count, a blob id or
    an LFS sha256 that is not a lowercase hex digest (an id names a file in
    ``blobs/``, so nothing else may pass)."""
    if not isinstance(info, dict):
        return None
    size, blob_id = info.get("size"), info.get("blob_id")
    lfs, xet = info.get("lfs_sha256"), info.get("xet_hash")
    if type(size) is not int or size < 0 or not isinstance(blob_id, str):
        return None
    if not _HEX40.fullmatch(blob_id):
        return None
    if lfs is not None and not (isinstance(lfs, str) and _HEX64.fullmatch(lfs)):
        return None
    if lfs is not None and info.get("lfs_size", size) != size:
        return None
    if xet is not None and not isinstance(xet, str):
        return None
    return TreeEntry(size, blob_id, lfs, xet)


def dump_tree(entries: dict[str, TreeEntry]) -> bytes:
    """``entries`` as a ``trees/<commit>.json`` file."""
    files = {path: entries[path].to_json() for path in sorted(entries)}
    return json.dumps({"format_version": FORMAT_VERSION, "files": files}, indent=1).encode()
