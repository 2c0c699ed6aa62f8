"""The hub cache as a load's sink: a weight file read from the Hub also fills the cache.

``HubSink`` is the Hugging Face cache's ``Sink`` (sinks/base.py), fed by the
``FillingBlob`` that ``HfCacheWrites`` (cache_writes.py) hands out. Each range read
is written into a temporary file in ``blobs/`` (blob_through.py): before its read
returns for a staged (GPU) load, whose buffers are reused at once; trailing the
reads for a load into host memory, whose tensors stay as they are until the load
returns, which waits for the writes (the reads go on meanwhile). Either way the
file holds the very bytes the load checked against the digest the Hub publishes,
and that check is the commit's: the blob is not hashed again. Once the blob is
closed, a commit thread (sinks/commits.py, keyed by the hub cache's folder) commits
the file when it was read whole and checked (a file whose check the load did not
make is hashed from disk first), and links the snapshot's file to it; anything else
leaves no file under a final name.
"""

from __future__ import annotations

from ...runtime.threads import Lane, run_blocking
from ...sources.base import Blob
from .. import commits
from ..base import Sink
from ..filling_blob import FillingBlob
from .blob_through import TemporaryBlob
from .blob_writer import WeightFile

__all__ = ["HubSink", "filling"]


class HubSink(Sink):
    """A weight file on its way into the hub cache (see the module).

    Args:
        target: where the file goes.
        file: the temporary file the ranges are written into.
    """

    def __init__(self, target: WeightFile, file: TemporaryBlob) -> None:
        super().__init__()
        self.target = target
        self._file: TemporaryBlob | None = file

    def __repr__(self) -> str:
        return f"<hub cache {self.target.path!r} of {self.target.snapshot.describe()}>"

    def write(self, offset: int, views: list[memoryview]) -> None:
        file = self._file
        assert file is not None, "written after its commit"
        file.write(offset, views)

    async def keep(self, offset: int, views: list[memoryview]) -> None:
        raise NotImplementedError("the hub cache writes each range as it is read")

    def failed(self, exc: OSError) -> None:
        """The bytes are in the caller's buffers already: only the cache gives up."""
        self.target.warn(exc)
        self.caching = False

    async def commit(self, blob: Blob) -> None:
        target, file, self._file = self.target, self._file, None
        assert file is not None, "committed twice"
        whole = self.caching and self.written.covers(0, target.size)
        checked = blob.checked == target.blob_id  # the load hashed these bytes
        commits.submit(
            target.cache.root,
            lambda: target.settle(lambda: file.publish(checked) if whole else file.discard()),
        )


async def filling(inner: Blob, target: WeightFile, lane: Lane, trail: bool) -> Blob:
    """``inner`` as a ``FillingBlob`` filling ``target``, its temporary file made and
    written in ``lane``: each read waits for its write, or (``trail``) the writes trail
    the reads and the close waits for them. ``inner`` itself, with a warning, when the
    cache cannot take a file."""
    try:
        file = await run_blocking(
            lane, lambda: TemporaryBlob(target), on_abandon=TemporaryBlob.discard
        )
    except OSError as exc:
        target.warn(exc)
        return inner
    except BaseException:
        await inner.aclose()
        raise
    return FillingBlob(inner, HubSink(target, file), through=lane, trail=trail)
