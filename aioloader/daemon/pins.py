"""Preloads are kept: their cache entries are held against eviction while the daemon runs.

A model of ``--model`` is what the node was started to keep, so no other fetch
may evict it: not the daemon's own downloads of models added through the API,
nor a pod's load that shares the cache. The cache never evicts an entry that a
process is reading (a shared ``flock`` on its ``use`` file, cache/entry.py), so
the daemon holds that lock on every file of each ready preload, the way a load
holds it while it reads. The cache's size limit then bounds everything else: if
the preloads alone outgrow it, the cache says so in its log and keeps them.

A pin is let go before the model is fetched again (a new version replaces its
files) or deleted (removal needs the entry to itself), and when the daemon
stops. A preload whose files vanish all the same (deleted by hand) is fetched
again (downloads.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ..cache.entry import EntryFiles, read_meta
from ..cache.locks import FileLock, acquire
from ..runtime.threads import Lane, run_blocking

if TYPE_CHECKING:
    from ..cache import ModelCache

__all__ = ["Pins"]


def _complete(files: EntryFiles) -> bool:
    meta = read_meta(files)
    return meta is not None and meta.complete and files.data.is_file()


class Pins:
    """The use locks held on the entries of pinned models, by model id.

    Use as ``with Pins(cache) as pins:`` (or ``async with``); leaving lets every pin go.
    """

    def __init__(self, cache: ModelCache) -> None:
        self._cache = cache
        self._held: dict[str, list[FileLock]] = {}
        self._lane = Lane("pins", 1)

    def __repr__(self) -> str:
        return f"<Pins models={len(self._held)}>"

    def __enter__(self) -> Pins:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Pins:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._held

    async def pin(self, model_id: str, urls: list[str]) -> bool:
        """Hold the entries of ``urls`` for ``model_id``; False (and nothing held) when
        one of them is no longer complete in the cache: evicted since it was fetched.

        Raises:
            OSError, CacheError: a lock file cannot be opened.
        """
        self.unpin(model_id)
        held: list[FileLock] = []
        try:
            for url in urls:
                files = self._cache.entry_files(url)
                held.append(
                    await acquire(
                        files.use,
                        exclusive=False,
                        executor=self._lane,
                        stall=self._cache.lock_stall,
                        what=url,
                    )
                )
                if not await run_blocking(self._lane, functools.partial(_complete, files)):
                    _release(held)
                    return False
        except BaseException:
            _release(held)
            raise
        self._held[model_id] = held
        return True

    def unpin(self, model_id: str) -> None:
        """Let go of ``model_id``'s entries (nothing if it holds none)."""
        _release(self._held.pop(model_id, []))

    def close(self) -> None:
        for model_id in list(self._held):
            self.unpin(model_id)
        self._lane.shutdown(wait=True)


def _release(locks: list[FileLock]) -> None:
    for lock in locks:
        lock.release()
