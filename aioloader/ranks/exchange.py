"""Loading once per group of processes: each rank reads a share, the ranks exchange the rest.

With tensor or pipeline parallelism, N processes on a node (or across nodes) load
the same checkpoint. Given a ``torch.distributed`` process group, every rank plans
the same reads (the plan is a pure function of the headers), and the reads are
split into N shares balanced by bytes: consecutive reads in file order, so a rank
reads whole files where there are enough of them and parts of a file where there
are not. Each rank reads its share from the source (file, HTTP, S3, cache) into the
tensors' final memory, and every read is broadcast from the rank that read it
straight into the same place on every other rank: no extra copy, and nothing held
beyond the tensors themselves.

The broadcasts run in one thread per rank (the ``exchange`` lane of threads.py,
owned by the load and closed with it), in the same order on every rank (round
robin over the shares, so each rank's first reads go out first), two at a time,
while the event loop goes on reading: exchange overlaps reading. Each read's data goes after a
small status broadcast from its owner, so that a rank that fails (or is
cancelled) tells the others at that point, and every rank stops with an error that
names it. A rank that dies outright is noticed when the process group's timeout
(``init_process_group(timeout=...)``) expires in the broadcast that waits for it.

Before anything is read, the ranks compare what they opened and planned (an
all-gather of each file's size, version and tensor table and of a digest of the
reads, or of the error that stopped them; agreement.py): different files, versions
of a file, settings or selections on different ranks fail every rank at once,
naming the file and what differs.

Tensors cut to each rank's own rows (``rows=``, rows.py) are read by every rank
for itself and take no part in the shares, the broadcasts or the plan's digest.

Host memory only for now: the exchange goes over the group's backend (gloo) on
CPU tensors.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ConfigError, DistributedError
from ..format.safetensors import FileHeader
from ..reads.plan import Read, Span
from ..runtime.threads import Lane, finish_before_cancel, run_blocking
from ..sources.base import Blob
from .agreement import (
    Status,
    compare,
    describe_tables,
    failed,
    identify,
    plan_digest,
    tensor_table,
    this_machine,
)

__all__ = ["DistributedError", "Exchange", "announce_failure", "run_exchange", "split_by_bytes"]

_OK, _FAILED = 1, 0
_MESSAGE = 2048  # bytes of a failure message sent to the other ranks
_UNIT = 64 << 20  # the most bytes of neighbouring reads broadcast at once
# Data broadcasts in flight at once: a gloo group runs collectives on two threads by
# default, so while one unit goes out the next one's status and data can start. With
# 4 ranks on 2 vCPUs a 1.08 GB load took 4.7-5.3 s this way, 5.9-9.9 s one at a time.
_IN_FLIGHT = 2
# The lane a collective waits in: its own, never a shared one, which a collective
# waiting for a slow rank would hold for up to the group's timeout.
_LANE = "exchange"

T = TypeVar("T")


def split_by_bytes(reads: Sequence[Read], ranks: int) -> list[int]:
    """The owning rank of each read: consecutive runs of reads, about equal in bytes."""
    total = sum(r.nbytes for r in reads)
    owners = []
    done = 0
    for read in reads:
        # The rank whose share holds this read's middle byte.
        middle = done + read.nbytes // 2
        owners.append(min(ranks - 1, middle * ranks // max(total, 1)))
        done += read.nbytes
    return owners


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _gather(group: Any, mine: Any) -> list[Any]:
    """Every rank's ``mine``, in rank order (a collective, blocking)."""
    dist = _dist()
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    return gathered


async def _collective(fn: Callable[[], T]) -> T:
    """Run the blocking ``fn`` in a thread of its own, closed once ``fn`` returns."""
    with Lane(_LANE, 1) as lane:
        return await run_blocking(lane, fn)


async def announce_failure(group: Any, error: BaseException) -> None:
    """Tell the other ranks, waiting in ``Exchange.agree``, that this one cannot load."""
    await _collective(lambda: _gather(group, failed(this_machine(), error, _MESSAGE)))


class Exchange:
    """The shares of one load's reads across ``group``, and the broadcasts between them."""

    def __init__(self, group: Any, reads: Sequence[Read]) -> None:
        dist = _dist()
        if dist.get_backend(group) not in ("gloo", "GLOO"):
            raise ConfigError(
                f"group= needs a gloo process group for host memory, not "
                f"{dist.get_backend(group)}; make one with dist.new_group(backend='gloo')"
            )
        self.group = group
        self.rank: int = dist.get_rank(group)
        self.world: int = dist.get_world_size(group)
        self.reads = list(reads)
        self.owners = split_by_bytes(self.reads, self.world)
        self._global = [dist.get_global_rank(group, r) for r in range(self.world)]
        self._landed = {i: threading.Event() for i, o in enumerate(self.owners) if o == self.rank}
        self._index = {id(read): i for i, read in enumerate(self.reads)}
        self._failure: str | None = None

    def mine(self) -> list[Read]:
        """The reads this rank reads itself, in file order."""
        return [r for r, o in zip(self.reads, self.owners, strict=True) if o == self.rank]

    @property
    def own_bytes(self) -> int:
        return sum(r.nbytes for r in self.mine())

    async def agree(self, blobs: Sequence[Blob], headers: Sequence[FileHeader]) -> None:
        """Check that every rank opened the same files, at the same version, and planned
        the same load (a collective: every rank calls it; see agreement.py).

        Raises:
            DistributedError: on every rank alike, naming the file and what differs.
        """

        def mine() -> Status:  # blocking: stats local files
            return Status(this_machine(), plan_digest(self.reads), identify(blobs, headers))

        statuses = await _collective(lambda: _gather(self.group, mine()))
        verdict = compare(statuses, self.rank)
        if verdict is None:
            return
        message = verdict.message
        if verdict.file is not None:  # every rank reaches it: name the first tensor apart
            table = tensor_table(headers[verdict.file])
            tables = await _collective(lambda: _gather(self.group, table))
            message += f" (first difference: {describe_tables(tables)})"
        raise DistributedError(message)

    def landed(self, read: Read) -> None:
        """This rank's own read is in place: its broadcast may go (thread-safe)."""
        self._landed[self._index[id(read)]].set()

    def fail(self, reason: str) -> None:
        """This rank stops: its next broadcast tells the others (thread-safe)."""
        if self._failure is None:
            self._failure = reason[:_MESSAGE]
        for event in self._landed.values():  # wakes the broadcast waiting for a read
            event.set()

    def units(self) -> list[list[int]]:
        """Runs of read indexes broadcast together: neighbours in one span with one owner,
        up to ``_UNIT`` bytes (one broadcast per 16 MiB read cost about 3x the time of one
        per 64 MiB on the machines measured)."""
        units: list[list[int]] = []
        size = 0
        for i, read in enumerate(self.reads):
            if units:
                last = self.reads[units[-1][-1]]
                if (
                    self.owners[units[-1][-1]] == self.owners[i]
                    and last.span is read.span
                    and last.end == read.start
                    and size + read.nbytes <= _UNIT
                ):
                    units[-1].append(i)
                    size += read.nbytes
                    continue
            units.append([i])
            size = read.nbytes
        return units

    def order(self) -> list[list[int]]:
        """The units in broadcast order: round robin over the ranks' shares."""
        shares: list[list[list[int]]] = [[] for _ in range(self.world)]
        for unit in self.units():
            shares[self.owners[unit[0]]].append(unit)
        ordered: list[list[int]] = []
        for step in range(max((len(s) for s in shares), default=0)):
            ordered.extend(s[step] for s in shares if step < len(s))
        return ordered

    def run(
        self,
        buffer_of: Callable[[Span, int, int], memoryview],
        received: Callable[[Read], None],
    ) -> None:
        """Broadcast every unit of reads, in ``order()`` (blocking: run it in a thread).

        Raises:
            DistributedError: a rank failed; this one raises too, naming it.
        """
        import numpy as np
        import torch

        dist = _dist()
        status = torch.zeros(1 + _MESSAGE, dtype=torch.uint8)
        pending: deque[tuple[Any, list[Read], int]] = deque()

        def settle(keep: int) -> None:
            while len(pending) > keep:
                work, reads, owner = pending.popleft()
                work.wait()
                if owner != self.rank:
                    for read in reads:
                        received(read)

        try:
            for unit in self.order():
                reads = [self.reads[i] for i in unit]
                owner = self.owners[unit[0]]
                source = self._global[owner]
                if owner == self.rank:
                    for i in unit:  # set when the read lands, or when this rank fails
                        self._landed[i].wait()
                    status.zero_()
                    if self._failure is None:
                        status[0] = _OK
                    else:
                        text = self._failure.encode()[:_MESSAGE]
                        status[1 : 1 + len(text)] = torch.frombuffer(
                            bytearray(text), dtype=torch.uint8
                        )
                    dist.broadcast(status, src=source, group=self.group)
                    if status[0] != _OK:
                        raise DistributedError(f"rank {self.rank} stopped: {self._failure}")
                else:
                    dist.broadcast(status, src=source, group=self.group)
                    if status[0] != _OK:
                        message = bytes(status[1:].numpy()).rstrip(b"\0").decode(errors="replace")
                        raise DistributedError(
                            f"rank {owner} of {self.world} failed while loading "
                            f"{reads[0].describe()}: {message}"
                        )
                view = buffer_of(reads[0].span, reads[0].start, reads[-1].end)
                data = torch.from_numpy(np.frombuffer(view, dtype=np.uint8))
                work = dist.broadcast(data, src=source, group=self.group, async_op=True)
                pending.append((work, reads, owner))
                settle(_IN_FLIGHT - 1)
            settle(0)
        finally:
            # Stopped early: broadcasts already started still write into the tensors.
            for work, _, _ in pending:
                with contextlib.suppress(Exception):
                    work.wait()


async def run_exchange(
    ex: Exchange,
    allocations: Mapping[Span, Any],
    landed: Callable[[Read], None],
    keep: Callable[[Read, memoryview], None] | None = None,
) -> None:
    """Run ``ex``'s broadcasts in a thread of their own; ``landed`` hears of each read
    received.

    ``keep`` (if given) sees each received read's bytes first, in the exchange's thread,
    before its tensors are handed out: e.g. to write them into the node cache.

    When this load fails or is cancelled meanwhile, the thread is told to stop: its
    next broadcast tells the other ranks, and it is waited for before this returns.
    """
    loop = asyncio.get_running_loop()

    def buffer_of(span: Span, start: int, end: int) -> memoryview:
        array = allocations[span].array  # host memory (see Exchange)
        return memoryview(array[start - span.start : end - span.start])

    def received(read: Read) -> None:
        if keep is not None:
            keep(read, buffer_of(read.span, read.start, read.end))
        loop.call_soon_threadsafe(landed, read)

    with Lane(_LANE, 1) as lane:
        future = loop.run_in_executor(lane, lambda: ex.run(buffer_of, received))
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            ex.fail("cancelled")
            with contextlib.suppress(Exception):  # its error names this rank's cancellation
                await finish_before_cancel(future)
            raise
