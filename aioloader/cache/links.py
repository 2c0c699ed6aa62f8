"""A fetched model's folder under ``<root>/models/``: symlinks to its entries' data.

``ModelLinks.plan`` decides every name before anything is downloaded (a pure
step), so a name that would leave the folder fails the fetch at once;
``create`` then makes the links (sync; run it in a thread). ``prune_models``
deletes the links to entries evicted or removed since.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

from ..errors import CacheError
from ..sources.layout import ModelLayout
from .entry import EntryFiles, key_of
from .paths import check_dirs, check_inside, checked_name, make_dirs

__all__ = ["ModelLinks", "prune_models"]


def _basename(url: str) -> str:
    """The decoded last segment of ``url``'s path ("model" when there is none)."""
    return unquote(urlparse(url).path.rstrip("/").rsplit("/", 1)[-1]) or "model"


@dataclass(frozen=True)
class ModelLinks:
    """The links of one model: ``(remote file URL, name below the model's folder)``.

    Attributes:
        key: the model folder's name (the SHA-256 of the URL or URLs).
        links: every file's link, in order; with an index, the index comes last.
        returns: what ``create`` returns: the index's link, the model folder, the one
            file's link, or the list of the files' links.
    """

    key: str
    links: tuple[tuple[str, str], ...]
    returns: Literal["last", "folder", "list"]

    @classmethod
    def plan(
        cls, url: str | list[str], layout: ModelLayout, parent: Callable[[str], str]
    ) -> ModelLinks:
        """Name every link of the model fetched as ``url``.

        Args:
            url: what was fetched (one URL, or a list of file URLs).
            layout: its files, as ``resolve_layout`` found them.
            parent: the source's ``parent`` (the folder of a URL).

        Raises:
            CacheError: a name, once decoded, is not a plain relative path (``..``,
                an absolute path, ...), or two files would share one name.
        """
        key = key_of(url if isinstance(url, str) else "\n".join(url))
        if layout.index is not None:
            base = parent(layout.index).rstrip("/") + "/"
            links = []
            for remote in layout.files:
                if remote.startswith(base):
                    name = checked_name(unquote(remote[len(base) :]), remote, nested=True)
                else:
                    name = checked_name(_basename(remote), remote)
                links.append((remote, name))
            links.append((layout.index, checked_name(_basename(layout.index), layout.index)))
            _refuse_doubles(links)
            return cls(key, tuple(links), "last")
        names: set[str] = set()
        links = []
        for i, remote in enumerate(layout.files):
            name = checked_name(_basename(remote), remote)
            # Files of a list or an S3 prefix may share a last segment: keep both.
            name = name if name not in names else f"{i}-{name}"
            names.add(name)
            links.append((remote, name))
        if not isinstance(url, str):
            return cls(key, tuple(links), "list")
        return cls(key, tuple(links), "last" if layout.files == (url,) else "folder")

    def create(self, root: Path) -> str | list[str]:
        """Make (or replace) the links under ``<root>/models/<key>/``.

        Raises:
            CacheError: a link was planted on the way, or a path would resolve
                outside the cache.
            OSError: as the file system reports.
        """
        folder = root / "models" / self.key
        paths = [self._link(root, folder, remote, name) for remote, name in self.links]
        if self.returns == "list":
            return paths
        return paths[-1] if self.returns == "last" else str(folder)

    @staticmethod
    def _link(root: Path, folder: Path, remote: str, name: str) -> str:
        target = EntryFiles.of(root, remote).data
        path = folder / name
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        for attempt in range(3):
            make_dirs(root, path.parent)
            check_inside(root, path, remote)
            try:
                os.symlink(target, temp)
                break
            except FileNotFoundError:
                # Another process pruned the folder as empty between the two calls.
                if attempt == 2:
                    raise
        # rename() replaces a link at ``path`` itself; it never follows one.
        os.replace(temp, path)
        return str(path)


def _refuse_doubles(links: list[tuple[str, str]]) -> None:
    seen: dict[str, str] = {}
    for remote, name in links:
        if name in seen:
            raise CacheError(
                f"model cache: {seen[name]} and {remote} would both be linked as {name!r}; "
                "nothing was written. Give the files distinct names on the server"
            )
        seen[name] = remote


def prune_models(root: Path) -> None:
    """Delete the links under ``<root>/models/`` to evicted or removed entries.

    A model folder left with no links goes too. A later fetch of that model
    links its files again.
    """
    models = root / "models"
    if not check_dirs(root, models):
        return
    for folder, dirs, files in os.walk(models, topdown=False):
        for name in files + dirs:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not os.path.exists(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if folder != str(models):
            with contextlib.suppress(OSError):  # not empty: it still links to entries
                os.rmdir(folder)
