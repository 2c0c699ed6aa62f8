"""A GCS object pinned to the generation it had when it was opened."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import Blob

__all__ = ["GcsBlob"]


class GcsBlob(Blob):
    """An object read at one generation; ``etag`` carries the generation for the cache."""

    def __init__(self, inner: Blob, generation: str) -> None:
        self.url = inner.url
        self.size = inner.size
        self._inner = inner
        self.generation = generation
        self.etag = f'"generation-{generation}"'
        self.last_modified = None

    def __repr__(self) -> str:
        return f"<GcsBlob {self.url!r} size={self.size} generation={self.generation}>"

    async def read_bytes(self, offset: int, length: int) -> bytes:
        return await self._inner.read_bytes(offset, length)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self._inner.read_into(offset, buffers)

    async def aclose(self) -> None:
        await self._inner.aclose()
