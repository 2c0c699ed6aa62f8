"""The thread policy: every thread aioloader starts belongs to a named, bounded lane.

A lane is a pool of threads named ``aioloader-<lane>``, started on demand and
closed by its owner, so a leak check can see every one (tests/conftest.py). No
work goes to the event loop's default executor, and no thread is made elsewhere.

Per owner (a ``Loader``, or one call of a ``ModelCache`` used without one), in
``Lanes``; each closes with its owner, once every call into it has returned:

* ``warm``: reads served from the page cache, a memory copy bound by the CPU: as
  many threads as the process may use CPUs (more only contend for the cores);
* ``cold``: reads that wait for the disk, which serves many at once: ``concurrency``
  threads, so the disk sees a deep queue (sources/file.py);
* ``cache``: the cache's own file work (checking and locking entries, writing
  partial files, evicting, linking): ``concurrency`` threads, one per read that may
  write through;
* ``compute``: pure work too long for the loop (parsing headers, planning reads,
  faulting in fresh tensor memory): bounded by the CPUs, like ``warm``;
* ``digest``: hashing files against their publishers' digests as they arrive
  (sources/verifying.py), each file's hash in order, so in a lane of its own: in
  ``compute`` it held up the faulting in that the reads wait for; bounded by the CPUs;
* ``setup``: rare one-off blocking calls (finding credentials, importing torch,
  pinning memory, starting a device): two threads, so one slow credential lookup
  does not hold up another store's.

Owned by one object for the length of a use, one thread each (their work is
ordered): ``Lane("copy", 1)``, a staged device's copy stream (devices/staged.py);
``Lane("exchange", 1)``, a group's broadcasts, per load (distributed.py); and
``start_thread``'s threads, each the event loop of one sync call (sync.py):
``sync``, a call made by synchronous code that may stand on a running loop's thread
(vLLM's cache fill), and ``vllm``, one vLLM weight stream (vllm.py). ``receive``: the
threads of ``HttpOptions.receive_lanes``, each an event loop that receives range bodies,
owned by one remote store's transport and closed with it (sources/http/lanes.py).

Per process, on purpose (``SharedPool``): ``cache-write``, the writes of a load's
bytes into the cache after the load has returned (cache/write_after.py), and
``commit``, the settling of an entry once its writes are done (cache/commit.py).
They finish work that outlives the load and its Loader; their threads are not
daemon threads, so a process that exits normally finishes what was submitted.
``PER_PROCESS`` names them.

``run_blocking`` runs one call in a lane and, when its caller is cancelled, still
waits for it: a thread cannot be interrupted, and the buffer or descriptor it uses
must not be reused meanwhile. ``run_in`` is ``asyncio.to_thread`` on a lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from types import TracebackType
from typing import ParamSpec, TypeVar

from ..errors import ClosedError

__all__ = [
    "CACHE_WRITES",
    "COMMITS",
    "PER_PROCESS",
    "Lane",
    "Lanes",
    "SharedPool",
    "finish_before_cancel",
    "lane_of",
    "run_blocking",
    "run_in",
    "start_thread",
    "usable_cpus",
]

T = TypeVar("T")
P = ParamSpec("P")
S = TypeVar("S", bound="_ClosedOnExit")

PREFIX = "aioloader-"
_SETUP_THREADS = 2


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container may narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def lane_of(thread_name: str) -> str | None:
    """The lane a thread belongs to (``"cold"`` for ``aioloader-cold_3``); None when it
    is not one of aioloader's."""
    if not thread_name.startswith(PREFIX):
        return None
    return thread_name[len(PREFIX) :].split("_", 1)[0]


class _ClosedOnExit:
    """``with owner:`` closes it (``close()``) on the way out."""

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class Lane(_ClosedOnExit, Executor):
    """A named pool of at most ``threads`` threads, ``aioloader-<name>_<n>``.

    Threads start on demand, or all at once ahead of the work with ``start()``.
    ``shutdown()`` (or leaving ``with``) joins them; a closed lane refuses work
    with ClosedError.
    """

    def __init__(self, name: str, threads: int) -> None:
        self.name = name
        self.threads = max(1, threads)
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._starter: threading.Thread | None = None
        self._ready: Future[None] | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Lane {self.name} {state} threads={self.threads}>"

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise ClosedError(f"the {self.name} threads are closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.threads, thread_name_prefix=PREFIX + self.name
                )
            return self._executor

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        try:
            return self._pool().submit(fn, *args, **kwargs)
        except RuntimeError as exc:
            if isinstance(exc, ClosedError):
                raise
            raise ClosedError(f"the {self.name} threads are closed") from exc

    def start(self) -> Future[None]:
        """Start every thread ahead of the work; the future is done once they run.

        A pool would otherwise start a thread on demand inside ``submit``, on the event
        loop, and each start waits until the new thread has run (on a busy machine that
        stalled the loop for tens of milliseconds). A helper thread submits one task
        per thread; they meet at a barrier so that none is reused before the last has
        started. Idempotent.
        """
        with self._lock:
            if self._ready is not None:
                return self._ready
            ready = self._ready = Future()
        executor, count = self._pool(), self.threads

        def fill() -> None:
            barrier = threading.Barrier(count, timeout=30)

            def rendezvous() -> None:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait()

            try:
                for _ in range(count):
                    executor.submit(rendezvous)
            except RuntimeError:  # shut down meanwhile
                barrier.abort()
            # Either way the lane is ready: it has its threads, or it refuses work itself.
            ready.set_result(None)

        self._starter = threading.Thread(
            target=fill, name=f"{PREFIX}{self.name}-start", daemon=True
        )
        self._starter.start()
        return ready

    async def started(self) -> None:
        """Return once every thread runs; the first call starts them."""
        ready = self.start()
        if not ready.done():
            # Shielded: one cancelled caller must not cancel the start others wait for.
            await asyncio.shield(asyncio.wrap_future(ready))

    def close(self) -> None:
        """``shutdown(wait=True)``."""
        self.shutdown(wait=True)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new work and join the threads (``wait``). Every ``run_blocking`` call
        has returned by the time its owner closes (it waits for its thread), so the
        joins are immediate. Idempotent."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
            starter, self._starter = self._starter, None
        if starter is not None and wait:
            starter.join()
        if executor is not None:
            executor.shutdown(wait=wait, cancel_futures=cancel_futures)


class Lanes(_ClosedOnExit):
    """The lanes of one owner (see the module docstring), each made on first use.

    Args:
        concurrency: the reads in flight at once: the bound of ``cold`` and ``cache``.
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._lanes: dict[str, Lane] = {}
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Lanes {state} concurrency={self.concurrency} started={sorted(self._lanes)}>"

    def _lane(self, name: str, threads: int) -> Lane:
        lane = self._lanes.get(name)
        if lane is None:
            if self._closed:
                raise ClosedError(f"the threads of this owner are closed (lane {name!r})")
            lane = self._lanes[name] = Lane(name, threads)
        return lane

    @property
    def warm(self) -> Lane:
        """Reads from the page cache: CPU bound."""
        return self._lane("warm", min(self.concurrency, usable_cpus()))

    @property
    def cold(self) -> Lane:
        """Reads that wait for the disk."""
        return self._lane("cold", self.concurrency)

    @property
    def cache(self) -> Lane:
        """The cache's file work: checks, locks, partial files, eviction, links."""
        return self._lane("cache", self.concurrency)

    @property
    def compute(self) -> Lane:
        """Pure work too long for the loop: headers, plans, faulting in memory."""
        return self._lane("compute", min(self.concurrency, usable_cpus()))

    @property
    def digest(self) -> Lane:
        """Hashing files as they arrive (sources/verifying.py): CPU bound."""
        return self._lane("digest", min(self.concurrency, usable_cpus()))

    @property
    def setup(self) -> Lane:
        """Rare one-off blocking calls: credentials, imports, pinning, device start."""
        return self._lane("setup", _SETUP_THREADS)

    def close(self) -> None:
        """Join every lane started; a later use raises ClosedError. Idempotent."""
        self._closed = True
        lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.shutdown(wait=True)


class SharedPool:
    """A lane shared by the whole process, started on first use (see ``PER_PROCESS``).

    Its threads are not daemon threads: a process that exits normally finishes
    what was submitted (Python joins them before it shuts down).
    """

    def __init__(self, name: str, threads: int) -> None:
        self.threads = threads
        self._name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.threads, thread_name_prefix=PREFIX + self._name
                )
            return self._executor


# Writes of a load's bytes into the cache after the load (cache/write_after.py):
# O_DIRECT writes of whole reads, so a handful keeps the disk's queue full.
CACHE_WRITES = SharedPool("cache-write", 8)
# Committing cache files once their writes are done (sinks/commits.py): short, ordered per
# entry; two so that one slow fsync does not hold up another entry's.
COMMITS = SharedPool("commit", 2)
# The lanes whose threads outlive a load on purpose (see the module docstring).
PER_PROCESS = frozenset({"cache-write", "commit"})


def start_thread(name: str, target: Callable[[], object]) -> threading.Thread:
    """Start one daemon thread ``aioloader-<name>`` that its caller joins (one vLLM
    weight stream's event loop): not a pool, the thread is the whole use."""
    thread = threading.Thread(target=target, name=PREFIX + name, daemon=True)
    thread.start()
    return thread


async def run_in(lane: Executor, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``asyncio.to_thread`` on ``lane``: a cancelled caller stops waiting at once.

    For calls that hold nothing the caller could reuse (credentials, an import).
    """
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(lane, call)


async def run_blocking(
    executor: Executor,
    fn: Callable[[], T],
    on_abandon: Callable[[T], object] | None = None,
) -> T:
    """Run ``fn`` in ``executor`` and return its result.

    A thread cannot be interrupted. If the caller is cancelled, this still waits
    for ``fn`` to return before re-raising, so no file descriptor is closed and no
    buffer is handed out while a thread may still be using it. Each call is one
    bounded read, so the wait is short. ``on_abandon`` receives a result that
    arrived after the caller was cancelled (e.g. to close a file it opened).
    """
    future = asyncio.get_running_loop().run_in_executor(executor, fn)
    try:
        return await finish_before_cancel(future)
    except asyncio.CancelledError:
        if not future.cancelled() and future.exception() is None and on_abandon is not None:
            on_abandon(future.result())
        raise


async def finish_before_cancel(
    future: asyncio.Future[T], stop: Callable[[], object] | None = None
) -> T:
    """Await ``future``; when cancelled meanwhile, wait for it to finish, then re-raise.

    For work that cannot be called back (a thread's read, a copy on a GPU stream):
    its resources must not be reused while it may still touch them. ``stop``, called
    once on cancellation, asks work that can end early to do so (a task on another
    thread's loop); the wait for its end is the same.
    """
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if stop is not None:
            stop()
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        raise
