"""Who reads what: this process reads every read of a load (Solo), or a share (Group).

Every load plans the same reads; a ``Ranks`` strategy decides which of them this
process reads itself and what else goes on around them, so that the load's own
steps are the same with or without ``group=``:

* ``Solo`` reads everything and has nothing else to do.
* ``Group`` (``group=``, a gloo process group; ranks_group.py) first agrees with the other ranks on
  files, versions and plan (agreement.py), then reads its share of the reads and
  broadcasts each one once it has landed, receiving the rest from the other ranks in
  one more worker (distributed.py); a failure, before the plan or during a read, is
  told to the other ranks so that every rank stops naming it.

A strategy serves one load: ``Loader`` makes a new one for each (``ranks_for``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from ..devices.base import Device, SpanAllocation
from ..errors import ConfigError
from ..format.safetensors import FileHeader
from ..reads.plan import Read, Span
from ..redact import redacting_logger
from ..sources.base import Blob

__all__ = ["Ranks", "Solo", "Worker", "ranks_for"]

logger = redacting_logger(__name__)

Worker = Coroutine[Any, Any, None]


class Ranks(Protocol):
    """How one load splits its reads among the processes that load it together."""

    async def announce_failure(self, error: BaseException) -> None:
        """The load failed before its reads were assigned (opening files, planning)."""

    async def assign(
        self, reads: Sequence[Read], blobs: Sequence[Blob], headers: Sequence[FileHeader]
    ) -> list[Read]:
        """The reads this process reads itself, in file order.

        Raises:
            DistributedError: the ranks disagree on what to load.
        """
        ...

    def landed(self, read: Read) -> None:
        """One of this process's own reads is in place."""

    def failed(self, error: BaseException) -> None:
        """One of this process's own reads failed; the load stops."""

    def workers(
        self, allocations: Mapping[Span, SpanAllocation], landed: Callable[[Read], None]
    ) -> list[Worker]:
        """Tasks to run beside the readers; ``landed`` hands out a read received."""
        ...

    @property
    def own_bytes(self) -> int | None:
        """For the report: the bytes this process read itself, None when it read all."""
        ...


class Solo:
    """This process reads every read of the load."""

    async def announce_failure(self, error: BaseException) -> None:
        pass

    async def assign(
        self, reads: Sequence[Read], blobs: Sequence[Blob], headers: Sequence[FileHeader]
    ) -> list[Read]:
        return list(reads)

    def landed(self, read: Read) -> None:
        pass

    def failed(self, error: BaseException) -> None:
        pass

    def workers(
        self, allocations: Mapping[Span, SpanAllocation], landed: Callable[[Read], None]
    ) -> list[Worker]:
        return []

    @property
    def own_bytes(self) -> int | None:
        return None


def ranks_for(group: Any, device: Device) -> Callable[[], Ranks]:
    """A new strategy for each load of a Loader: Solo, or Group with ``group=``.

    Raises:
        ConfigError: ``group=`` with a device other than host memory.
    """
    if group is None:
        return Solo
    if device.name != "cpu":
        raise ConfigError(
            f"group= exchanges host memory over gloo; load to device='cpu' (not "
            f"{device.name}) and move the tensors, or load without group="
        )
    from .group import Group  # the exchange and the agreement: only with group=

    return functools.partial(Group, group)
