"""A warm start of a branch or tag: read from the hub cache while the Hub is asked.

A load of ``hf://org/name@main`` must read the commit ``main`` points to now, which
only the Hub knows: one request, which on a cold start is nothing beside the
download, but on a warm start from the hub cache is often the largest part of it
(the request, its TLS handshake and huggingface_hub's client, against a model
that the page cache hands over in a fraction of a second).

So when the hub cache holds a ref for the revision and the listing of the commit
it names, the load reads that commit at once (pinned to its sha, so nothing of
another commit can enter it) while the Hub is asked where the revision points
now. The result is returned only once the Hub has answered: the same commit, and
it is the answer; another one, and it is dropped and the revision loaded as if
nothing had been cached (which records the new ref). The Hub's errors are the
load's errors, as without the cache; when the Hub gives no answer in time, the
cached commit is the answer, with a warning (revision.py). Only a whole load whose
tensors nobody has seen yet can be taken back like this, so streams, and ranks
that exchange bytes, ask first (under the same deadline, source.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...runtime.tasks import gather
from .source import HfSource
from .url import HfLocation

__all__ = ["load_warm"]

T = TypeVar("T")


async def load_warm(
    source: HfSource, location: HfLocation, load: Callable[[HfLocation], Awaitable[T]]
) -> T:
    """``await load(location)``, started from the hub cache's commit for its revision
    when there is one (see the module docstring).

    Args:
        source: the HfSource ``load`` reads through.
        location: where on the Hub (an ``hf://`` URL, parsed).
        load: loads a place on the Hub; called once, or twice when the revision has moved.
    """
    cached = await source.cached_commit(location)
    if cached is None:
        return await load(location)
    pinned = location.at(revision=cached)
    now: list[str] = []
    done: list[T] = []

    async def ask() -> None:
        now.append(await source.current_commit(location, cached))

    async def read() -> None:
        done.append(await load(pinned))

    await gather([ask(), read()])  # either one's error cancels the other
    if now[0] == cached:
        return done[0]
    done.clear()
    return await load(location)
