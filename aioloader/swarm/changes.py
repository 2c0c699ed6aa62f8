"""The manifests a node answers with, and a wait for the next change of them.

A follower used to ask each node it follows every quarter second or so, and three
asks in four came back "unchanged" (304): at 32 nodes on two vCPUs, about 15 asks a
second per node, sent and answered, took the CPU the transfers needed. Now a follower
that already holds a node's manifest asks with ``Prefer: wait=N`` (RFC 7240), and the
node holds the ask until that manifest changes, for ``N`` seconds at most
(answering.py): an unchanged node costs one ask per ``N`` seconds, and a change is
answered the moment it happens instead of at the next poll.

``Manifests`` is the dict the node keeps them in: every change through it (set, pop,
delete, update, clear, ``setdefault`` of a new key) wakes whoever ``await changed(...)``. A change
made on another thread wakes them through the loop's thread-safe call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .manifest import Manifest

__all__ = ["MAX_HOLD", "Manifests"]

MAX_HOLD = 30.0  # seconds an ask is held at most, whatever the asker prefers


class Manifests(dict[str, "Manifest"]):
    """Model key -> the manifest answered for it; ``changed()`` waits for the next change.
    ``release()`` (the daemon stopping) ends every wait now and every later one at once."""

    def __init__(self) -> None:
        super().__init__()
        self._next: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self.released = False

    def __repr__(self) -> str:
        return f"<Manifests {len(self)} models{' released' if self.released else ''}>"

    def __setitem__(self, key: str, value: Manifest) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._changed()

    def pop(self, key: str, *default: Any) -> Any:
        had = key in self
        value = super().pop(key, *default)
        if had:
            self._changed()
        return value

    def setdefault(self, key: str, default: Manifest) -> Manifest:  # type: ignore[override]
        if key in self:
            return self[key]
        self[key] = default
        return default

    def update(self, *args: Any, **kwargs: Manifest) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def release(self) -> None:
        """Wake every wait now; later ones return at once (no answer is held any more)."""
        self.released = True
        self._changed()

    async def changed(self, seconds: float) -> None:
        """Return at the next change, or after ``seconds``, whichever comes first."""
        if self.released or seconds <= 0:
            return
        if self._next is None or self._next.done():
            self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()
            self._next = self._loop.create_future()
        # Shared by every waiter: asyncio.wait leaves it pending when the time runs out.
        await asyncio.wait([self._next], timeout=seconds)

    def _changed(self) -> None:
        waiting, loop = self._next, self._loop
        if waiting is None or loop is None:
            return
        self._next = None
        if threading.get_ident() == self._thread:
            _wake(waiting)
        else:  # a change made on another thread: woken on the loop's
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_wake, waiting)


def _wake(waiting: asyncio.Future[None]) -> None:
    if not waiting.done():
        waiting.set_result(None)
