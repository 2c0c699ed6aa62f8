"""The write-through mode of a load through the cache: staged (GPU) loads.

Their buffers are staging memory that the load reuses as soon as a read returns, so
each range is written into the entry's partial file before its read returns. When
a write finds the cache full (see ``entry.no_room``), the blob stops caching and
reads on from the remote: the bytes are in the caller's buffers already, only the
cache gives up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .entry import cache_error, no_room
from .partial import PartialFile

if TYPE_CHECKING:
    from .filling_blob import FillingBlob

__all__ = ["WriteThrough"]


class WriteThrough:
    """Reads into buffers the load reuses: write each range before its read returns."""

    async def arrived(self, blob: FillingBlob, offset: int, views: list[memoryview]) -> None:
        """Write bytes just read from the remote into the caller's ``views``.

        Raises:
            CacheError: the write failed for another reason than a cache without room.
        """
        partial: PartialFile | None = blob.partial
        if partial is None:
            return
        try:
            await blob.run(lambda: partial.write(offset, views))
        except OSError as exc:
            if not no_room(exc):
                raise cache_error(exc, blob.cache.root, f"writing {blob.url}") from exc
            blob.give_up(exc)
