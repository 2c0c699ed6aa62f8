"""A Hub repository's files at one commit (pure).

The Hub is asked once for the commit a revision points to and for the files at
that commit; every folder listing and every file opened afterwards is answered
from this record, so one load never mixes two commits of a moving branch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import NotFoundError
from .tree import TreeEntry, bad_path
from .url import HfLocation

__all__ = ["Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """The files of ``repo_id`` at commit ``sha``.

    Attributes:
        repo_id: ``org/name``.
        revision: the revision that was asked for (a branch, tag or sha).
        sha: the commit it pointed to.
        files: path in the repository -> size in bytes.
        ids: path -> the id of its blob in the hub cache: the LFS sha256 of a weight
            file, the git blob sha1 of a regular one (empty when not known).
        tree: the listing it was made of, as tree.py keeps it (empty when the files
            were found by walking the cache's snapshot folder). It may hold files that
            ``files`` leaves out (``left_out``).
    """

    repo_id: str
    revision: str
    sha: str
    files: dict[str, int]
    ids: dict[str, str] = field(default_factory=dict)
    tree: dict[str, TreeEntry] = field(default_factory=dict)

    @classmethod
    def of_tree(cls, repo_id: str, revision: str, sha: str, tree: dict[str, TreeEntry]) -> Snapshot:
        """The snapshot a commit's listing describes: its files but those whose names
        aioloader does not make files of (``tree.bad_path``: a backslash, a control
        character), which no load needs and which must not fail one."""
        usable = [path for path in tree if bad_path(path) is None]
        files = {path: tree[path].size for path in usable}
        ids = {path: tree[path].cache_id for path in usable}
        return cls(repo_id, revision, sha, files, ids, dict(tree))

    @property
    def left_out(self) -> list[str]:
        """The listed paths that are not among ``files``, sorted."""
        return sorted(path for path in self.tree if path not in self.files)

    def describe(self) -> str:
        """``org/name@revision`` and, when they differ, the commit it resolved to."""
        where = f"{self.repo_id}@{self.revision}"
        return where if self.revision == self.sha else f"{where} (commit {self.sha})"

    def is_folder(self, path: str) -> bool:
        """Whether ``path`` is the root or a folder holding files (folders are implicit)."""
        prefix = path + "/" if path else ""
        return any(name.startswith(prefix) for name in self.files)

    def names_in(self, path: str) -> list[str] | None:
        """The names directly inside the folder ``path`` (sub-folders end in ``/``),
        sorted; None when ``path`` is a file.

        Raises:
            NotFoundError: ``path`` is neither a file nor a folder at this commit.
        """
        if path in self.files:
            return None
        prefix = path + "/" if path else ""
        names = {
            name[len(prefix) :].split("/", 1)[0] + ("/" if "/" in name[len(prefix) :] else "")
            for name in self.files
            if name.startswith(prefix)
        }
        if not names:
            raise self.missing(path)
        return sorted(names)

    def size_of(self, path: str) -> int:
        """The size of the file ``path``.

        Raises:
            NotFoundError: there is no such file at this commit.
        """
        size = self.files.get(path)
        if size is None:
            raise self.missing(path)
        return size

    def missing(self, path: str) -> NotFoundError:
        """The error for a path this commit does not hold, with what to do."""
        url = HfLocation(self.repo_id, self.revision, path).url()
        what = "a folder" if self.is_folder(path) else "no file or folder"
        return NotFoundError(
            f"{url}: {self.describe()} holds {what} named {path!r}; check the path (it is "
            f"case-sensitive) against the repository's files at {self.sha[:12]}"
        )
