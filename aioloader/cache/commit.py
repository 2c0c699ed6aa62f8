"""Committing finished cache entries after the load that wrote them has returned.

A load through the cache (sink.py) gets each file's bytes into its entry (as
they arrive, or, into host memory, in writer threads once the load is over), but
making the entry complete (waiting for those writes, hashing, ``fsync``, the
rename to ``data``, ``meta.json``, eviction under the cap) takes as long as the
disk needs to take the file: seconds for a large model. That work is not what the
caller waits for, so it runs here (``settle``), in the process's commit threads
(sinks/commits.py), while the entry stays locked exactly as it was during the download.

What a crash does to an entry whose commit had not finished: its ``data.partial``
and journal stay, ``meta.json`` still says incomplete, and its lock is dropped
with the process. The next load or fetch of the file on the same boot finds the
ranges that were written journaled, reads them from the partial file instead of
the remote, downloads the others and commits the entry. After a reboot the
partial file is not trusted (its bytes may never have reached the disk) and is
downloaded again: the same rule as for any interrupted download (see partial.py).
A crash after the rename to ``data`` and before ``meta.json`` says complete leaves a
file fsynced before its rename: the next load or fetch takes it back and checks it
against its journal, on any boot (journal.py).

The commit threads are not daemon threads: a process that exits normally waits
for its pending commits (Python joins them before it shuts down).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import CacheError
from ..redact import redacting_logger
from .entry import cache_error, discard_quietly, no_room
from .partial import PartialFile, RangeMismatch
from .protocol import CacheProtocol
from .write_after import LaterWrites

__all__ = ["settle"]

logger = redacting_logger(__name__)


def settle(
    cache: CacheProtocol,
    url: str,
    partial: PartialFile,
    later: LaterWrites,
    finished: bool,
    release: Callable[[], None],
) -> None:
    """Wait for the ``later`` writes, complete the entry when ``finished`` (else it stays
    resumable), then ``release`` it: the job a load hands to ``commits.submit``, so it logs its
    errors (the tensors are loaded already: nothing can fail but the entry)."""
    try:
        later.finish()
        if finished:
            partial.complete()
    except RangeMismatch as exc:
        logger.warning("model cache %s: %s; not caching %s", cache.root, exc, url)
        partial.close()
        discard_quietly(partial.files)
    except OSError as exc:
        if no_room(exc):
            cache.warn_uncached(exc, url)
            partial.close()
            discard_quietly(partial.files)
        else:
            logger.warning("%s", cache_error(exc, cache.root, f"completing {url}"))
    except Exception:
        logger.exception("completing the cache entry of %s failed", url)
    else:
        if finished:
            try:
                cache.eviction.after_complete(url)
            except CacheError as exc:
                logger.warning("%s", exc)
    finally:
        release()
