"""The hub cache as a load's sink: a weight file read from the Hub also fills the cache.

``HubSink`` is the Hugging Face cache's ``Sink`` (sinks/base.py), fed by the
``FillingBlob`` that ``HfCacheWrites`` (cache_writes.py) hands out. A staged (GPU)
load writes each range through into a temporary file in ``blobs/`` before its read
returns (blob_through.py), and the digest the load checked is the commit's; a load
into host memory keeps the ranges it read, views of the caller's tensors and the
header's bytes, each with a cheap digest taken on arrival, written after the load and
checked against those digests, where the load checked the Hub's (blob_writer.py; written through,
each read waiting for its write, the loads of scripts/hf_bench.py took 1.57 s, not
1.28). Either way, once the blob is closed, a commit thread
(sinks/commits.py, keyed by the hub cache's folder) commits the file when it was
read whole and its digest is the one the Hub publishes, and links the snapshot's
file to it; anything else leaves no file under a final name.
"""

from __future__ import annotations

import xxhash

from ...runtime.threads import Lane, run_blocking
from ...sources.base import Blob
from .. import commits
from ..base import Sink
from ..filling_blob import FillingBlob
from .blob_through import TemporaryBlob
from .blob_writer import Kept, WeightFile, write_blob

__all__ = ["HubSink", "filling"]


class HubSink(Sink):
    """A weight file on its way into the hub cache (see the module).

    Args:
        target: where the file goes.
        file: write through into this temporary file; None: keep the ranges read and
            write them after the load.
    """

    def __init__(
        self, target: WeightFile, file: TemporaryBlob | None, lane: Lane | None = None
    ) -> None:
        super().__init__()
        self.target = target
        self._file = file
        self._lane = lane  # where the digests of the ranges kept are taken
        self._kept: list[Kept] = []

    def __repr__(self) -> str:
        mode = "through" if self._file is not None else "after"
        return f"<hub cache {self.target.path!r} of {self.target.snapshot.describe()} {mode}>"

    def write(self, offset: int, views: list[memoryview]) -> None:
        file = self._file
        assert file is not None, "written through without a temporary file"
        file.write(offset, views)

    async def keep(self, offset: int, views: list[memoryview]) -> None:
        assert self._lane is not None, "kept without a lane for the digests"
        digest = await run_blocking(self._lane, lambda: _xxh3(views))
        self._kept.append((offset, list(views), digest))

    def failed(self, exc: OSError) -> None:
        """The bytes are in the caller's buffers already: only the cache gives up."""
        self.target.warn(exc)
        self.caching = False

    async def commit(self, blob: Blob) -> None:
        target, file, self._file = self.target, self._file, None
        if file is not None:
            whole = self.caching and self.written.covers(0, target.size)
            checked = blob.checked == target.blob_id  # the load hashed these bytes
            commits.submit(
                target.cache.root,
                lambda: target.settle(lambda: file.publish(checked) if whole else file.discard()),
            )
            return
        # Whatever the load did: a file not read whole, or not the Hub's bytes, is not
        # written (write_blob), and one committed meanwhile is linked.
        kept, self._kept = self._kept, []
        cache, blob_id, size = target.cache, target.blob_id, target.size
        checked = blob.checked == blob_id  # the load hashed these bytes as they arrived
        commits.submit(
            cache.root,
            lambda: target.settle(lambda: write_blob(cache, blob_id, size, kept, checked)),
        )


async def filling(
    inner: Blob, target: WeightFile, through: Lane | None, lane: Lane | None = None
) -> Blob:
    """``inner`` as a ``FillingBlob`` filling ``target``: written through in ``through``
    (its temporary file made there), or after the load when None, the digests of the
    ranges kept taken in ``lane``. ``inner`` itself, with a warning, when the cache
    cannot take a file."""
    if through is None:
        assert lane is not None, "written after the load without a lane for the digests"
        return FillingBlob(inner, HubSink(target, None, lane), through=None)
    try:
        file = await run_blocking(
            through, lambda: TemporaryBlob(target), on_abandon=TemporaryBlob.discard
        )
    except OSError as exc:
        target.warn(exc)
        return inner
    except BaseException:
        await inner.aclose()
        raise
    return FillingBlob(inner, HubSink(target, file), through=through)


def _xxh3(views: list[memoryview]) -> str:
    digest = xxhash.xxh3_64()
    for view in views:
        digest.update(view)
    return str(digest.hexdigest())
