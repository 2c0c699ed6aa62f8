"""The ``Ranks`` strategy of a ``group=`` load (ranks.py): this process reads a share of
the reads and the ranks exchange the rest (distributed.py), after agreeing on files,
versions and plan (agreement.py). Imported only by a Loader given ``group=``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from ..devices.base import SpanAllocation
from ..format.safetensors import FileHeader
from ..reads.plan import Read, Span
from ..redact import redacting_logger
from ..sources.base import Blob
from .exchange import Exchange, announce_failure, run_exchange

__all__ = ["Group"]

logger = redacting_logger(__name__)

Worker = Coroutine[Any, Any, None]  # as ranks.Worker: one more task of the load


class Group:
    """The ranks of ``group`` split the reads and exchange them (see distributed.py).

    Tensors cut to each rank's own rows (``rows=``) are read by every rank for itself
    and never exchanged.
    """

    def __init__(self, group: Any) -> None:
        self.group = group
        self._exchange: Exchange | None = None
        self._blobs: Sequence[Blob] = ()
        self._own_bytes = 0
        self._keep_failed = False  # a blob refused what other ranks sent

    @property
    def exchange(self) -> Exchange:
        if self._exchange is None:
            raise RuntimeError("the reads of this load are not assigned yet")
        return self._exchange

    async def announce_failure(self, error: BaseException) -> None:
        # The other ranks wait in Exchange.agree to hear from this one.
        await announce_failure(self.group, error)

    async def assign(
        self, reads: Sequence[Read], blobs: Sequence[Blob], headers: Sequence[FileHeader]
    ) -> list[Read]:
        self._exchange = Exchange(self.group, [r for r in reads if not r.span.sliced])
        await self._exchange.agree(blobs, headers)
        self._blobs = blobs
        own = sorted(
            self._exchange.mine() + [r for r in reads if r.span.sliced],
            key=lambda r: (r.span.file, r.start),
        )
        self._own_bytes = sum(r.nbytes for r in own)
        return own

    def landed(self, read: Read) -> None:
        if not read.span.sliced:
            self.exchange.landed(read)

    def failed(self, error: BaseException) -> None:
        # The other ranks hear it from this one, in its next broadcast.
        self.exchange.fail(f"{type(error).__name__}: {error}")

    def workers(
        self, allocations: Mapping[Span, SpanAllocation], landed: Callable[[Read], None]
    ) -> list[Worker]:
        return [run_exchange(self.exchange, allocations, landed, self._keep)]

    @property
    def own_bytes(self) -> int | None:
        return self._own_bytes

    def _keep(self, read: Read, data: memoryview) -> None:
        """A read another rank sent: offer its bytes to the file's blob, as if read here
        (the node cache writes them, so an entry completes though this rank read only
        its share). Runs in the exchange's thread; never fails the load."""
        if self._keep_failed:
            return
        try:
            self._blobs[read.span.file].received(read.start, [data])
        except Exception as exc:
            # The other ranks wait for this one's next broadcast: the load goes on.
            self._keep_failed = True
            logger.warning("%s: not keeping the bytes other ranks sent: %s", read.url, exc)
