"""Where a fetch's files come from other than their origin (``Supply``): the one seam
through which another room (the swarm, aioloader/swarm/) takes part in a fetch.

A fetch (fetch.py) tells its supply the files once it knows them (``expect``), asks it
per file how the file comes (``delivery``: None, read from the origin; else a
``Delivery``: a blob to read, a wait before a read takes a slot, and where it can, the
missing bytes landed straight into the entry's partial file, ``Arrival``), shows it the
origin's blobs it reads (``from_origin``), tells it each entry it committed
(``committed``), asks whether a file's failure lets the others finish first
(``detour``), and lets it go before the origin closes (``aclose``). The base class
supplies nothing: every file is read from its origin.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from ..sources.base import Blob, Source
from .entry import Version

__all__ = ["Arrival", "Delivery", "Supply", "Supplying"]


class Arrival(Protocol):
    """A file's bytes written straight into its entry's partial file by someone else."""

    async def arrived(self, start: int, end: int) -> None:
        """Return once bytes ``[start, end)`` are in the file, checked by their writer;
        an ``OSError`` where the writer could not write it (this cache's disk: the fetch
        reports it as the cache's error)."""

    async def verified(self) -> None:
        """Return once the whole file matches what its origin publishes of it (at once
        where it publishes nothing); ``DigestMismatchError`` where it does not."""


class Delivery:
    """One file that comes other than read from its origin: read from ``blob`` (its
    size and validators are the origin's current version)."""

    def __init__(self, blob: Blob) -> None:
        self.blob = blob

    async def ready(self, start: int, end: int) -> None:
        """Return once a read of ``[start, end)`` would not wait for bytes on their way:
        a read waits here before it takes one of the fetch's few read slots (an
        ``OSError``: they could not be written on this node's disk). Here: at once."""

    def landing(self, path: Path) -> AbstractAsyncContextManager[Arrival | None]:
        """Write the missing bytes straight into ``path`` (the entry's partial file, made,
        sized and held by the fetch): the context yields an ``Arrival`` and ``path`` is
        written until it exits (an exit by an error stops the writes before it returns);
        None: the bytes are read from ``blob``. Here: None."""
        return contextlib.nullcontext(None)


class Supply:
    """Where a fetch's files come from other than their origin; here: nowhere else."""

    def expect(self, urls: list[str]) -> None:
        """The files of the fetch, all of them, once its layout is known."""

    async def delivery(self, url: str, origin: Source, lane: Executor) -> Delivery | None:
        """How the file at ``url`` comes (None: read from ``origin``); asked before the
        file is opened and before a read slot is taken (it may wait), once per open (the
        index is opened for the layout and again for its entry). ``lane``: the fetch's
        cache threads. Here: None."""
        return None

    def from_origin(self, blob: Blob) -> Blob:
        """The origin's ``blob`` as the fetch reads it (a supply may count its reads).
        Here: itself."""
        return blob

    async def committed(self, url: str, data: Path, version: Version) -> None:
        """This fetch committed the entry of ``url``: its bytes at ``data``."""

    def detour(self, error: BaseException) -> bool:
        """Whether ``error``, failing one file, lets the fetch's other files finish before
        it is raised (their reads are not lost; the file comes another way next time).
        Here: no."""
        return False

    async def aclose(self) -> None:
        """The fetch ended, well or not: what the supply started for it goes."""


class Supplying(Source):
    """``origin`` with a fetch's ``supply`` in front, for what reads a model's layout:
    its files open through the supply first (an index another node holds is read
    there); the rest is the origin's."""

    def __init__(self, origin: Source, supply: Supply, lane: Executor) -> None:
        self.origin, self.supply, self.lane = origin, supply, lane
        self.etag_is_md5 = origin.etag_is_md5

    def __repr__(self) -> str:
        return f"<Supplying {self.origin!r}>"

    async def list_dir(self, url: str) -> list[str] | None:
        return await self.origin.list_dir(url)

    async def open(self, url: str) -> Blob:
        delivery = await self.supply.delivery(url, self.origin, self.lane)
        if delivery is not None:
            return delivery.blob
        return self.supply.from_origin(await self.origin.open(url))

    def join(self, base: str, name: str) -> str:
        return self.origin.join(base, name)

    def parent(self, url: str) -> str:
        return self.origin.parent(url)

    async def aclose(self) -> None:
        """Nothing of its own: the origin and the supply are the fetch's."""
