"""The commits of cache files, run after the load that read them has returned.

Making a file that a load filled a complete cache file (waiting for the writes after
the load, hashing, ``fsync``, the rename into place, the records around it) takes as
long as the disk needs to take the file: seconds for a large model. That is not what
the caller waits for, so it runs here, in a small process-wide thread pool
(``threads.COMMITS``), each job keyed by the cache folder it writes into, so that
``wait`` can wait for one cache's.

The pool's threads are not daemon threads: a process that exits normally waits for
its pending commits (Python joins them before it shuts down).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from ..runtime.threads import COMMITS

__all__ = ["submit", "wait"]

_lock = threading.Lock()
_pending: dict[str, set[Future[None]]] = {}


def submit(root: Path, job: Callable[[], None]) -> None:
    """Run ``job`` (which must handle its own errors) in a commit thread, counted as
    writing into the cache folder ``root``."""
    key = str(root)
    with _lock:
        future = COMMITS.get().submit(job)
        _pending.setdefault(key, set()).add(future)

    def done(f: Future[None]) -> None:
        with _lock:
            futures = _pending.get(key)
            if futures is not None:
                futures.discard(f)
                if not futures:
                    del _pending[key]

    future.add_done_callback(done)


async def wait(root: Path) -> None:
    """Wait until every commit under ``root`` submitted so far has finished.

    Cancelling the wait leaves the commits running.
    """
    with _lock:
        futures = list(_pending.get(str(root), ()))
    for future in futures:
        await asyncio.shield(asyncio.wrap_future(future))
