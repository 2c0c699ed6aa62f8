"""DEST of ``aioloader fetch``: its lock, its partial folders, the record of what fetch
wrote there, and the commit that makes DEST hold exactly one version of the model.

DEST may hold files of its own: fetch never removes a file it did not write. What
it wrote is recorded in ``DEST/.aioloader-fetch.json`` (``RECORD``). A fetch into a
DEST that a fetch filled before commits in this order:

1. the record is rewritten to name the files of both versions, so that a copy
   killed in the steps below leaves a record of every file fetch wrote, and the
   next fetch cleans up after it;
2. the old version's files that the new one lacks, and all of its weights
   (``*.safetensors`` and indexes: shards before the index), are removed, along
   with the folders that leaves empty;
3. the new files are renamed into place, indexes first;
4. the record is rewritten to name the new version's files only.

So DEST never holds two versions' weights at once: while a fetch commits (or after
one was killed committing, until the next fetch) an index names shards that are
not there yet, and a load of DEST fails instead of mixing versions. Only a model
folder whose several ``.safetensors`` files have no index can load partly then.

Nothing is written or removed outside DEST: sub-folders are opened from DEST's
descriptor without following links, so a link planted at ``DEST/sub`` is refused,
not written through. Every ``OSError`` on the DEST side becomes a ``CacheError``
naming DEST and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import CacheError
from ..format.names import length_problem
from ..redact import redact, redacting_logger
from ..sources.layout import INDEX_SUFFIX, SAFETENSORS_SUFFIX

__all__ = ["PARTIAL_PREFIX", "RECORD", "Destination", "dest_error", "name_problem"]

logger = redacting_logger(__name__)

PARTIAL_PREFIX = ".aioloader-partial-"
RECORD = ".aioloader-fetch.json"
_UNTOUCHED = "Nothing of this fetch was left in it"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def name_problem(name: str) -> str | None:
    """Why ``name`` (``/``-separated, relative to DEST) cannot be written safely, or None."""
    parts = name.split("/")
    if not name or "\0" in name or "\\" in name or name.startswith("/"):
        return "is empty, absolute or holds a NUL or a backslash"
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' segment"
    if parts[0].startswith(PARTIAL_PREFIX) or parts[0] == RECORD:
        return "is a name fetch keeps for itself"
    return length_problem(name)


def dest_error(exc: OSError, dest: Path, doing: str, state: str = _UNTOUCHED) -> CacheError:
    """A one-line CacheError for an OSError met while ``doing`` something in DEST;
    ``state`` says what DEST holds now."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "the disk is full: free space there, or fetch into a folder on a bigger disk"
    elif exc.errno == errno.EFBIG:
        hint = "a file is larger than the file system or a limit (ulimit -f) allows there"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = f"it is not writable by uid {os.getuid()}: make it so, or fetch elsewhere"
    elif exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
        hint = "a link, a file or a folder is in the way: remove it, or fetch elsewhere"
    else:
        hint = "check the disk, or fetch elsewhere"
    named = isinstance(exc.filename, str) and exc.filename and exc.filename != str(dest)
    what = f" {exc.filename}" if named else ""
    return CacheError(
        f"aioloader fetch into {dest}: {doing}{what} failed ({exc.strerror or exc}); {hint}. "
        f"{state}; fetch again when that is fixed"
    )


def _weights(name: str) -> bool:
    return name.endswith((SAFETENSORS_SUFFIX, INDEX_SUFFIX))


def _is_index(name: str) -> bool:
    return name.endswith(INDEX_SUFFIX)


class Destination:
    """DEST, locked: blocking methods, run them in a thread."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd  # DEST itself, flock()ed; every name below is opened from it
        self.changed = False  # whether a commit began to change what DEST holds

    @classmethod
    def open(cls, path: Path) -> Destination:
        """Make DEST, take its lock (waits for another fetch) and remove stale partials."""
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise dest_error(exc, path, "creating") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for stale in path.glob(PARTIAL_PREFIX + "*"):
                shutil.rmtree(stale, ignore_errors=True)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def close(self) -> None:
        os.close(self.fd)

    def new_partial(self) -> Path:
        """A new, empty partial folder in DEST; removed by the next fetch if left."""
        try:
            return Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=self.path))
        except OSError as exc:
            raise dest_error(exc, self.path, "creating a folder in") from None

    def commit(self, partial: Path, names: Sequence[str], source: str) -> list[str]:
        """Make DEST hold the files ``names`` of ``partial`` (see the module); returns the
        weights in DEST's top folder that fetch did not write and left there."""
        self.changed = False
        try:
            return self._commit(partial, list(names), source)
        except OSError as exc:
            state = "It holds no complete model now" if self.changed else _UNTOUCHED
            raise dest_error(exc, self.path, "moving the files into place", state) from None

    def _commit(self, partial: Path, new: list[str], source: str) -> list[str]:
        old = self._recorded()
        self._record(partial, sorted({*old, *new}), source, complete=False)
        self.changed = True
        keep = set(new)
        gone = [n for n in old if n not in keep or _weights(n)]
        # Shards before indexes: an index stays until no shard it names is left.
        for name in sorted(gone, key=lambda n: (_is_index(n), _weights(n) is False)):
            self._remove(name)
        dirs: dict[str, int] = {}
        try:
            # Indexes first: until every shard is there, a load finds one missing.
            for name in sorted(new, key=lambda n: (not _is_index(n), not _weights(n), n)):
                folder, _, base = name.rpartition("/")
                if folder not in dirs:
                    dirs[folder] = self._folder(folder)
                os.replace(partial / name, base, dst_dir_fd=dirs[folder])
            for fd in dirs.values():
                os.fsync(fd)
        finally:
            for fd in dirs.values():
                os.close(fd)
        self._record(partial, sorted(new), source, complete=True)
        return sorted(n for n in os.listdir(self.fd) if _weights(n) and n not in keep)

    def _folder(self, folder: str) -> int:
        """A descriptor of ``DEST/folder``, made if missing; refuses links on the way."""
        fd = os.dup(self.fd)
        try:
            for part in folder.split("/") if folder else ():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                try:
                    inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise CacheError(
                            f"aioloader fetch into {self.path}: {self.path / folder} is not a "
                            "folder (a link or a file is in the way; fetch writes nothing "
                            "through links): remove it and fetch again"
                        ) from None
                    raise
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _remove(self, name: str) -> None:
        """Remove a file an earlier fetch wrote, and the folders that leaves empty; a
        name that is gone, a folder now, or behind a link is left alone."""
        parts = name.split("/")
        fds = [os.dup(self.fd)]
        try:
            for part in parts[:-1]:
                try:
                    fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
                except (FileNotFoundError, NotADirectoryError):
                    return
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        return
                    raise
            _ignore_gone(os.unlink, parts[-1], fds[-1])
            for depth in range(len(parts) - 1, 0, -1):
                if _ignore_gone(os.rmdir, parts[depth - 1], fds[depth - 1]):
                    break  # not empty: nor are the folders above it
        finally:
            for fd in fds:
                os.close(fd)

    def _recorded(self) -> list[str]:
        """The files the last fetch recorded; [] when none or the record is unusable."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no FIFO waits
        try:
            fd = os.open(RECORD, flags, dir_fd=self.fd)
        except FileNotFoundError:
            return []
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            fd = -1
        raw = b""
        if fd >= 0:
            with os.fdopen(fd, "rb") as file:
                if stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                    raw = file.read(1 << 24)
        try:
            files = json.loads(raw)["files"]
            if isinstance(files, list) and all(
                isinstance(n, str) and name_problem(n) is None for n in files
            ):
                return files
        except (ValueError, TypeError, KeyError):
            pass
        logger.warning(
            "%s: the record of an earlier fetch is not one this version reads; the files it "
            "names stay (remove them by hand if they are stale)", self.path / RECORD,
        )  # fmt: skip
        return []

    def _record(self, partial: Path, files: list[str], source: str, *, complete: bool) -> None:
        # A presigned source's signature is a secret: the record keeps the URL redacted.
        body = {"source": redact(source), "complete": complete, "files": files}
        temporary = partial / RECORD
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(body, file, indent=1)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, RECORD, dst_dir_fd=self.fd)
        os.fsync(self.fd)


def _ignore_gone(remove: Callable[..., None], name: str, folder: int) -> bool:
    """``remove(name, dir_fd=folder)``; True when it did nothing: the name is gone, a
    folder (unlink) or not empty (rmdir)."""
    try:
        remove(name, dir_fd=folder)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ELOOP, errno.EBUSY):
            return True
        raise
    return False
