"""The Hugging Face hub cache's layout: where a repository's files live on disk.

The layout is huggingface_hub's, so that every tool reading that cache
(huggingface_hub, transformers, vLLM) finds what aioloader wrote, and aioloader
finds what they wrote::

    <root>/models--org--name/
        blobs/<id>                       the bytes; <id> is the LFS sha256 of a weight
                                         file, the git blob sha1 of a regular file
        snapshots/<commit>/<path>        a relative symlink to ../../blobs/<id>
        refs/<branch or tag>             the commit it pointed to, no newline
        trees/<commit>.json              the commit's file listing (tree.py)

The file work here is synchronous, for a thread, but for the reads of refs and listings
a load makes from the event loop (``load_*``), which go through aiofiles in the
caller's lane (small_files.py). A blob is written under a
temporary name in ``blobs/`` and renamed (sinks/hf/blob_writer.py), and links and refs are
renamed into place too, so a reader never sees half of anything.
"""

from __future__ import annotations

import os
import secrets
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from ...errors import LoaderError, NotFoundError
from ...runtime.small_files import read_bytes, read_text
from .snapshot import Snapshot
from .tree import TreeEntry, dump_tree, parse_tree
from .url import HfLocation, is_commit

__all__ = ["HfCache", "cache_root", "sweep_temporaries", "temporary_name"]

_OFFLINE = "HF_HUB_OFFLINE is set"


def cache_root() -> Path:
    """The hub cache in use now: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    huggingface_hub's default (its constants are read when it is imported, and the
    environment may have changed since, so the variables are read first)."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def temporary_name(final: Path) -> Path:
    """A name beside ``final`` that no other writer (thread or process) uses."""
    return final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def sweep_temporaries(final: Path) -> None:
    """Delete the temporary files beside ``final`` that dead processes left (a crash
    mid-write); a live writer's are left alone."""
    for temporary in final.parent.glob(f".{final.name}.*.tmp"):
        pid = temporary.name[len(final.name) + 2 :].split("-", 1)[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            temporary.unlink(missing_ok=True)
        except (ValueError, OSError):
            continue


def _replace_link(link: Path, target: str) -> None:
    if link.is_symlink() and os.readlink(link) == target:
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_name(link)
    os.symlink(target, temporary)
    try:
        os.replace(temporary, link)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class HfCache:
    """One repository's folder in the hub cache at ``root``.

    Attributes:
        root: the hub cache (``cache_root()``).
        repo_id: ``org/name``.
    """

    root: Path
    repo_id: str

    @property
    def folder(self) -> Path:
        """``<root>/models--org--name``."""
        return self.root / ("models--" + self.repo_id.replace("/", "--"))

    def blob(self, blob_id: str) -> Path:
        return self.folder / "blobs" / blob_id

    def file(self, commit: str, path: str) -> Path:
        """Where the file ``path`` of ``commit`` is linked."""
        return self.folder / "snapshots" / commit / path

    def find(self, commit: str, path: str, size: int) -> Path | None:
        """The cached file ``path`` of ``commit`` when it is there whole (its link
        leads to a blob of ``size`` bytes), else None."""
        try:
            found = self.file(commit, path).stat()
        except (OSError, ValueError):
            return None
        return self.file(commit, path) if found.st_size == size else None

    def link(self, commit: str, path: str, blob_id: str) -> None:
        """Link ``snapshots/<commit>/<path>`` to the blob (which must be committed)."""
        link = self.file(commit, path)
        _replace_link(link, os.path.relpath(self.blob(blob_id), link.parent))

    def write_ref(self, revision: str, commit: str) -> None:
        """Record that ``revision`` (a branch or tag) points to ``commit``."""
        if is_commit(revision) or self.read_ref(revision) == commit:
            return
        ref = self.folder / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        temporary = temporary_name(ref)
        try:
            temporary.write_text(commit)
            os.replace(temporary, ref)
        finally:
            temporary.unlink(missing_ok=True)

    def read_ref(self, revision: str) -> str | None:
        """The commit the cache last recorded ``revision`` (a branch or tag) at, or None."""
        try:
            commit = (self.folder / "refs" / revision).read_text().strip()
        except (OSError, ValueError):
            return None
        return commit if is_commit(commit) else None

    async def load_ref(self, revision: str, lane: Executor) -> str | None:
        """``read_ref`` from the event loop: the ref read with aiofiles in ``lane``."""
        try:
            commit = (await read_text(self.folder / "refs" / revision, lane)).strip()
        except LoaderError:
            return None
        return commit if is_commit(commit) else None

    async def load_tree(self, commit: str, lane: Executor) -> dict[str, TreeEntry] | None:
        """``read_tree`` from the event loop: the listing read with aiofiles in ``lane``."""
        if not is_commit(commit):
            return None
        try:
            data = await read_bytes(self._tree_file(commit), lane)
        except LoaderError:
            return None
        return parse_tree(data)

    async def load_snapshot(self, revision: str, lane: Executor) -> Snapshot | None:
        """The commit of ``revision``'s ref with its files, when the cache holds that
        commit's listing too (a load can start from it: warm_start.py); else None."""
        commit = await self.load_ref(revision, lane)
        tree = await self.load_tree(commit, lane) if commit else None
        if commit is None or tree is None:
            return None
        return Snapshot.of_tree(self.repo_id, commit, commit, tree)

    def _tree_file(self, commit: str) -> Path:
        return self.folder / "trees" / f"{commit}.json"

    def read_tree(self, commit: str) -> dict[str, TreeEntry] | None:
        """The listing of ``commit`` kept in the cache, or None when there is none
        that this version reads (see tree.py)."""
        if not is_commit(commit):
            return None
        try:
            data = self._tree_file(commit).read_bytes()
        except (OSError, ValueError):
            return None
        return parse_tree(data)

    def write_tree(self, commit: str, tree: dict[str, TreeEntry]) -> None:
        """Keep the listing of ``commit`` (a commit never changes: written once)."""
        final = self._tree_file(commit)
        if not is_commit(commit) or not tree or final.exists():
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = temporary_name(final)
        try:
            temporary.write_bytes(dump_tree(tree))
            os.replace(temporary, final)
        finally:
            temporary.unlink(missing_ok=True)

    def snapshot(self, location: HfLocation) -> Snapshot:
        """The files of ``location.revision`` as the cache holds them, for offline use.

        Raises:
            NotFoundError: the cache has no such ref or commit.
        """
        revision = location.revision
        commit = revision if is_commit(revision) else self.read_ref(revision) or ""
        tree = self.read_tree(commit) if commit else None
        if tree is not None and self.file(commit, "").is_dir():
            return Snapshot.of_tree(self.repo_id, revision, commit, tree)
        files = self._files(commit) if commit else None
        if files is None:
            raise NotFoundError(
                f"{location.url()}: {_OFFLINE} and the Hugging Face cache at {self.root} holds "
                f"no {'commit' if is_commit(revision) else 'ref'} {revision!r} of "
                f"{self.repo_id}; load it once online (unset HF_HUB_OFFLINE), or set "
                "HF_HUB_CACHE to the cache that holds it"
            )
        return Snapshot(self.repo_id, revision, commit, files)

    def _files(self, commit: str) -> dict[str, int] | None:
        top = self.folder / "snapshots" / commit
        if not top.is_dir():
            return None
        files = {}
        for folder, _, names in os.walk(top):
            for name in names:
                full = Path(folder) / name
                try:
                    size = full.stat().st_size
                except OSError:
                    size = -1  # a link whose blob is gone: listed, so its load says so
                files[full.relative_to(top).as_posix()] = size
        return files

    def missing_offline(self, location: HfLocation, commit: str) -> NotFoundError:
        """The error for a file an offline load needs and the cache lacks."""
        return NotFoundError(
            f"{location.url()}: {_OFFLINE} and the Hugging Face cache at {self.root} lacks "
            f"{location.path!r} of {self.repo_id} at {commit[:12]}; load it once online "
            "(unset HF_HUB_OFFLINE) to fill the cache"
        )
