"""Small whole files, read and written with aiofiles in the caller's lane.

Around the hot path a load reads and writes a few small files whole: a model's
``*.safetensors.index.json``, the Hugging Face cache's refs and tree listings, the
node cache's ``meta.json``. They go through aiofiles, with the caller's lane
(threads.py) as its executor, so their threads are named, bounded and closed with
their owner like every other (never the event loop's default executor).

Tensor bytes never come here: aiofiles hands a read back as a new ``bytes`` object,
and a load reads with ``os.preadv`` straight into the tensor's memory instead
(sources/file.py, direct_io.py).

Errors name the file: ``NotFoundError``, ``AccessDeniedError``, ``FormatError`` for a
file whose bytes are not what they should be (not JSON, not UTF-8), and ``SourceError``
(reading: also a path that is not a regular file) or ``CacheError`` (writing) for any
other failure.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os

from ..errors import (
    AccessDeniedError,
    CacheError,
    FormatError,
    LoaderError,
    NotFoundError,
    SourceError,
)
from ..format.safetensors import load_json

__all__ = [
    "read_bytes",
    "read_json",
    "read_text",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]

_fsync = aiofiles.os.wrap(os.fsync)  # type: ignore[no-untyped-call]
# Files are closed with ``await file.close()``, not ``async with``: aiofiles' context
# manager closes the file in the event loop's default executor, not in ``executor``.


class _NotRegular(OSError):
    """The path names something other than a regular file (the argument says what)."""


def _open_regular(path: str, flags: int) -> int:
    """aiofiles' opener: refuses anything but a regular file. ``O_NONBLOCK`` first, so a
    named pipe cannot hold the lane's thread waiting for a writer."""
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular("a directory" if stat.S_ISDIR(mode) else "not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _error(exc: OSError, path: str | Path, doing: str, other: type[LoaderError]) -> LoaderError:
    if isinstance(exc, _NotRegular):
        return SourceError(f"{path} is {exc}, where a file was expected ({doing} it)")
    if exc.errno == errno.ENOENT:
        where = "it" if doing == "reading" else "its folder"
        return NotFoundError(f"{path}: {where} does not exist (while {doing} it)")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return AccessDeniedError(
            f"permission denied while {doing} {path}: the user running aioloader "
            f"(uid {os.getuid()}) needs {'read' if doing == 'reading' else 'write'} access "
            "to it and its folder"
        )
    return other(f"{doing} {path} failed: {exc}")


async def read_bytes(path: str | Path, lane: Executor) -> bytes:
    """The whole file at ``path``, read in ``lane``.

    Raises:
        NotFoundError, AccessDeniedError, SourceError (also: not a regular file).
    """
    try:
        file = await aiofiles.open(path, "rb", opener=_open_regular, executor=lane)
        try:
            data: bytes = await file.read()
        finally:
            await file.close()
    except OSError as exc:
        raise _error(exc, path, "reading", SourceError) from exc
    return data


async def read_text(path: str | Path, lane: Executor) -> str:
    """The whole UTF-8 file at ``path``, read in ``lane``.

    Raises:
        FormatError: not UTF-8; and as ``read_bytes``.
    """
    data = await read_bytes(path, lane)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path} is not UTF-8 text ({exc}); remove it or fix it") from exc


async def read_json(path: str | Path, lane: Executor) -> Any:
    """The JSON document at ``path``, read in ``lane`` (a key given twice is refused).

    Raises:
        FormatError: not JSON; and as ``read_bytes``.
    """
    data = await read_bytes(path, lane)
    try:
        return load_json(data)
    except ValueError as exc:
        raise FormatError(f"{path} is not valid JSON ({exc}); remove it or fix it") from exc


async def write_bytes_atomic(path: str | Path, data: bytes, lane: Executor) -> None:
    """Replace ``path`` with ``data`` atomically, in ``lane``: a temporary file beside it,
    fsync, rename. A reader sees the old file or the new one, never part of one; a crash
    before the rename leaves the old file (and a ``.<name>.<pid>-<hex>.tmp`` beside it).

    Raises:
        NotFoundError: the folder does not exist.
        AccessDeniedError: the folder is not writable.
        CacheError: any other failure (a full disk).
    """
    final = Path(path)
    temporary = final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        file = await aiofiles.open(temporary, "xb", executor=lane)
        try:
            await file.write(data)
            await file.flush()
            await _fsync(file.fileno(), executor=lane)
        finally:
            await file.close()
        await aiofiles.os.replace(temporary, final, executor=lane)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            await aiofiles.os.remove(temporary, executor=lane)
        if isinstance(exc, OSError):
            raise _error(exc, final, "writing", CacheError) from exc
        raise


async def write_text_atomic(path: str | Path, text: str, lane: Executor) -> None:
    """``write_bytes_atomic`` of ``text`` in UTF-8."""
    await write_bytes_atomic(path, text.encode(), lane)


async def write_json_atomic(path: str | Path, obj: Any, lane: Executor) -> None:
    """``write_bytes_atomic`` of ``obj`` as JSON (keys sorted, so equal objects give equal
    files)."""
    await write_bytes_atomic(path, json.dumps(obj, sort_keys=True).encode(), lane)
