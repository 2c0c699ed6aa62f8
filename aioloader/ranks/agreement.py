"""What the ranks of a ``group=`` load compare before reading: files, versions, plan.

Ranks exchange bytes by position: rank 1 takes bytes [a, b) of the second file from
rank 0 on trust. Two ranks that opened different files with one layout, or one URL
at two versions (two CDN edges during a rollout), would end with torn tensors and
no error. So before anything is read every rank sends every other a ``Status``:

* the identity of each file it opened: its size; its version as the storage named
  it (the ETag, else Last-Modified); for a local file its device, inode and
  modification time, compared among the ranks on one machine only (copies on two
  machines have different inodes); and a digest of its tensor table (names,
  dtypes, shapes and offsets);
* a digest of its read plan (which tensors, in which reads);
* or the error that stopped it before it could plan.

Every rank receives the same statuses and reaches the same verdict, so every rank
fails, with the same message naming the file and what differs. Pure code: the
all-gathers are distributed.py's.

What this cannot see: copies with the same size and tensor table but different
bytes on two machines, or served without any validator.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..format.safetensors import FileHeader
from ..reads.plan import Read
from ..sources.base import Blob
from ..sources.file import FileBlob, to_path

__all__ = [
    "FileIdentity",
    "Status",
    "Verdict",
    "compare",
    "describe_tables",
    "failed",
    "identify",
    "plan_digest",
    "tensor_table",
    "this_machine",
]

_SHOWN = 4  # files that differ named in full; the rest are counted
_TENSORS = "its tensors differ (names, dtypes, shapes or offsets)"

TensorRow = tuple[str, str, tuple[int, ...], int, int]


@dataclass(frozen=True)
class FileIdentity:
    """One opened file, as one rank sees it."""

    url: str
    size: int
    etag: str | None
    last_modified: str | None
    local: tuple[int, int, int] | None  # st_dev, st_ino, st_mtime_ns of a local file
    tensors: str  # digest of tensor_table()


@dataclass(frozen=True)
class Status:
    """What one rank tells the others before the load: its files and plan, or its error."""

    machine: str
    plan: str | None = None
    files: tuple[FileIdentity, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    """The ranks disagree: ``message``; ``file`` is the index of a file whose tensor
    tables differ (the ranks then gather those tables to name the first difference)."""

    message: str
    file: int | None = None


@functools.cache
def this_machine() -> str:
    """The machine this rank runs on: host name and kernel boot id (blocking, once)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def tensor_table(header: FileHeader) -> list[TensorRow]:
    return [(t.name, t.dtype, t.shape, t.start, t.end) for t in header.tensors]


def _digest_table(header: FileHeader) -> str:
    digest = hashlib.sha256()
    for row in tensor_table(header):
        digest.update(repr(row).encode())
    return digest.hexdigest()


def _local_identity(blob: Blob) -> tuple[int, int, int] | None:
    if not isinstance(blob, FileBlob):
        return None
    try:
        st = os.stat(to_path(blob.url))
    except OSError:
        return None  # gone since it was opened: the size and tensors are still compared
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def identify(blobs: Sequence[Blob], headers: Sequence[FileHeader]) -> tuple[FileIdentity, ...]:
    """The identity of each opened file (blocking: stats local files)."""
    return tuple(
        FileIdentity(
            url=blob.url,
            size=blob.size,
            etag=blob.etag,
            last_modified=blob.last_modified,
            local=_local_identity(blob),
            tensors=_digest_table(header),
        )
        for blob, header in zip(blobs, headers, strict=True)
    )


def plan_digest(reads: Sequence[Read]) -> str:
    digest = hashlib.sha256()
    for read in reads:
        digest.update(f"{read.span.file}:{read.start}:{read.end};".encode())
    return digest.hexdigest()


def failed(machine: str, error: BaseException, limit: int) -> Status:
    return Status(machine, error=f"{type(error).__name__}: {error}"[:limit])


def _by_value(values: Sequence[tuple[int, Hashable]], show: Callable[[Any], str]) -> str:
    """``ranks 0, 2: X; rank 1: Y`` for (rank, value) pairs."""
    ranks: dict[Hashable, list[int]] = {}
    for rank, value in values:
        ranks.setdefault(value, []).append(rank)
    parts = []
    for value, rs in ranks.items():
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"
        parts.append(f"{who}: {show(value)}")
    return "; ".join(parts)


def _differs(pairs: Sequence[tuple[int, Hashable]]) -> bool:
    return len({value for _, value in pairs}) > 1


def _file_differences(i: int, statuses: Sequence[Status]) -> list[str]:
    """What differs between the ranks' views of file ``i``."""
    files = [(r, s.files[i]) for r, s in enumerate(statuses)]
    found = []
    sizes = [(r, f.size) for r, f in files]
    if _differs(sizes):
        found.append(f"its size differs ({_by_value(sizes, lambda v: f'{v} bytes')})")
    etags = [(r, f.etag) for r, f in files if f.etag is not None]
    modified = [(r, f.last_modified) for r, f in files if f.last_modified is not None]
    if _differs(etags):
        found.append(f"its ETag differs ({_by_value(etags, str)})")
    elif not etags and _differs(modified):
        found.append(f"its Last-Modified differs ({_by_value(modified, str)})")
    by_machine: dict[str, list[tuple[int, Hashable]]] = {}
    for r, f in files:
        if f.local is not None:
            by_machine.setdefault(statuses[r].machine, []).append((r, f.local))
    for local in by_machine.values():
        if _differs(local):
            shown = _by_value(local, lambda v: f"inode {v[1]} on device {v[0]}, mtime_ns {v[2]}")
            found.append(f"the ranks on one machine opened different files ({shown})")
    if _differs([(r, f.tensors) for r, f in files]):
        found.append(_TENSORS)
    return found


def _file_name(i: int, statuses: Sequence[Status]) -> str:
    urls = [(r, s.files[i].url) for r, s in enumerate(statuses)]
    if not _differs(urls):
        return urls[0][1]
    return f"file {i + 1} ({_by_value(urls, str)})"


def compare(statuses: Sequence[Status], rank: int) -> Verdict | None:
    """Whether the ranks may load together: None, or what stops them (the same on
    every rank but for ``rank``'s own error, which that rank raises itself)."""
    errors = [(r, s.error) for r, s in enumerate(statuses) if s.error is not None and r != rank]
    if errors:
        named = "; ".join(f"rank {r}: {message}" for r, message in errors)
        return Verdict(f"{len(errors)} rank(s) of the group failed to start the load: {named}")
    counts = [(r, len(s.files)) for r, s in enumerate(statuses)]
    if _differs(counts):
        return Verdict(
            f"the ranks opened different numbers of files ({_by_value(counts, str)}): "
            "every rank must load the same model"
        )
    differences = [_file_differences(i, statuses) for i in range(len(statuses[0].files))]
    differing = [i for i, found in enumerate(differences) if found]
    if differing:
        lines = [
            f"{_file_name(i, statuses)}: {'; '.join(differences[i])}" for i in differing[:_SHOWN]
        ]
        if len(differing) > _SHOWN:
            lines.append(f"and {len(differing) - _SHOWN} more files")
        tables = next((i for i in differing if differences[i][-1] == _TENSORS), None)
        return Verdict(
            "the ranks opened different files or versions of a file, and would exchange "
            f"bytes of different tensors: {' | '.join(lines)}. Every rank must load the same "
            "files at the same version: if the storage is being updated (a CDN rollout, an "
            "upload in progress), load again once it is done",
            tables,
        )
    plans = [(r, s.plan) for r, s in enumerate(statuses)]
    if _differs(plans):
        groups: dict[Hashable, list[int]] = {}
        for r, plan in plans:
            groups.setdefault(plan, []).append(r)
        named = " / ".join(f"ranks {', '.join(map(str, rs))}" for rs in groups.values())
        return Verdict(
            f"the ranks planned different loads ({named}): every rank must load the same "
            "URL with the same tensors= selection, chunk_size and rows= tensors"
        )
    return None


def describe_tables(tables: Sequence[list[TensorRow]]) -> str:
    """The first tensor on which the ranks' tables of one file differ."""

    def show(row: TensorRow | None) -> str:
        if row is None:
            return "no tensor"
        name, dtype, shape, start, end = row
        return f"{name!r} {dtype} {list(shape)} at bytes [{start}, {end})"

    longest = max(len(t) for t in tables)
    for k in range(longest):
        rows = [(r, t[k] if k < len(t) else None) for r, t in enumerate(tables)]
        if _differs(rows):
            return f"tensor {k + 1} in file order: {_by_value(rows, show)}"
    return "the tables are the same"
