"""Which receiver a transport gets (``receiver``), and ``receive_lanes="auto"``: range
bodies received on the caller's loop until that loop's thread is busy, then on receive
lanes (lanes.py).

The loop's thread is busy when it computed through at least ``BUSY`` of the time it was
not waiting for a core, over a window of ``WINDOW`` seconds, read on it as range GETs
start and end: a thread that hardly ever sleeps in its poll for events is the bottleneck,
receiving (about 0.5 CPU s per GB) or running whatever else the caller's loop runs. The
times are Linux's ``/proc/thread-self/schedstat`` (time run, time runnable but waiting
for a core): the wait is taken out so that a machine busy with other processes, which
delays every wake-up, does not make an idle loop look busy, nor a busy one look idle for
the core it did not get. Where the file is missing, the thread's CPU time over the wall
time is the measure (``time.thread_time``). The file is read at most once a window
(about 20 us; procfs, never the disk). From then on new range GETs go to the lanes; those
in flight finish where they are, and the lanes stay until the transport is closed. A
process that may use one CPU never starts them (``receiver``): a thread there adds no core,
only contention. The windows are measured, not assumed: an idle moment between loads
lowers a window's share, it never raises one.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable

from ...errors import ClosedError
from ...redact import redacting_logger
from ...runtime.threads import usable_cpus
from ...settings.values import AUTO_LANES, HttpOptions
from .client import Answer, RangeClient
from .lanes import ReceiveLanes, Receiver

__all__ = ["BUSY", "WINDOW", "AutoLanes", "busy_share", "demand_clock", "receiver"]

logger = redacting_logger(__name__)

#: The loop's share of one core, over a window of WINDOW seconds, that starts the lanes.
BUSY = 0.8
WINDOW = 0.25
#: The most lanes it starts: more than the cores the process may use only contend.
AUTO_COUNT = 4
_SCHEDSTAT = "/proc/thread-self/schedstat"


def _scheduled() -> tuple[float, float]:
    """Seconds this thread ran, and waited to run (``schedstat``'s first two numbers)."""
    with open(_SCHEDSTAT, "rb") as file:
        ran, waited = file.read().split()[:2]
    return int(ran) / 1e9, int(waited) / 1e9


def _cpu_only() -> tuple[float, float]:
    return time.thread_time(), 0.0


def demand_clock() -> Callable[[], tuple[float, float]]:
    """The clock ``AutoLanes`` reads on the loop's thread, (ran, waited) in seconds:
    ``schedstat`` where this system has it, else the thread's CPU time and no wait."""
    try:
        _scheduled()
    except (OSError, ValueError):
        return _cpu_only
    return _scheduled


def busy_share(wall: float, ran: float, waited: float) -> float:
    """The share of ``wall`` seconds, less those ``waited`` for a core, that a thread ran:
    1.0 when it never slept (also when it waited all along)."""
    awake = wall - waited
    return 1.0 if awake <= ran or awake <= 0 else ran / awake


class AutoLanes:
    """The caller's loop's own RangeClient until that loop's thread is busy (see the
    module docstring), then ``lanes()``. Use from one event loop.

    Args:
        own: the caller's loop's RangeClient.
        lanes: makes the lanes, once.
    """

    def __init__(self, own: RangeClient, lanes: Callable[[], Receiver]) -> None:
        self._own = own
        self._make = lanes
        self._lanes: Receiver | None = None
        self._window: tuple[float, float, float] | None = None  # (wall, ran, waited)
        self._demand = demand_clock()
        self._closed = False

    def __repr__(self) -> str:
        return f"<AutoLanes lanes={self._lanes!r} closed={self._closed}>"

    @property
    def lanes(self) -> Receiver | None:
        """The lanes, once the loop was found busy; None before."""
        return self._lanes

    def _look(self) -> None:
        """Take the loop thread's busy share over the window that ends now; start the
        lanes when it is ``BUSY``. Called on the loop's thread, so the clock is its own."""
        now = time.perf_counter()
        if self._window is not None and now - self._window[0] < WINDOW:
            return
        ran, waited = self._demand()
        if self._window is None:
            self._window = (now, ran, waited)
            return
        wall = now - self._window[0]
        busy = busy_share(wall, ran - self._window[1], waited - self._window[2])
        self._window = (now, ran, waited)
        if busy >= BUSY and not self._closed:
            self._lanes = self._make()
            logger.info(
                "receive lanes: the event loop's thread was busy %.0f%% of the last %.2f s; "
                "range bodies are received on %s from now on",
                busy * 100,
                wall,
                self._lanes,
            )

    async def get_into(
        self,
        url: str,
        headers: dict[str, str],
        length: int,
        sink: Callable[[], memoryview],
        advance: Callable[[int], None],
        accept: Callable[[Answer], bool],
    ) -> Answer | None:
        """``get_into`` of the loop's RangeClient, or of the lanes once they started.

        Raises:
            WireError: as RangeClient's, and whatever ``accept`` raises, unchanged.
            ClosedError: closed before or during the transfer.
        """
        if self._closed:
            raise ClosedError("the receive lanes are closed (HttpTransport.aclose)")
        if self._lanes is not None:
            return await self._lanes.get_into(url, headers, length, sink, advance, accept)
        self._look()
        try:
            return await self._own.get_into(url, headers, length, sink, advance, accept)
        finally:
            if self._lanes is None:
                self._look()

    async def aclose(self) -> None:
        """Close the loop's connections and the lanes, if they started. Idempotent."""
        self._closed = True
        try:
            await self._own.aclose()
        finally:
            if self._lanes is not None:
                await self._lanes.aclose()


def receiver(ssl_context: ssl.SSLContext | None, options: HttpOptions) -> Receiver:
    """The caller's loop's own RangeClient for one lane, ``receive_lanes`` lanes for more,
    and for ``"auto"`` an ``AutoLanes`` (the loop's own client where one CPU is usable)."""

    def client() -> RangeClient:
        return RangeClient(
            ssl_context,
            options.connect_timeout,
            options.stall_timeout,
            options.min_speed,
            options.speed_window,
        )

    if options.receive_lanes == AUTO_LANES:
        cpus = usable_cpus()
        if cpus < 2:
            return client()
        return AutoLanes(client(), lambda: ReceiveLanes(min(cpus, AUTO_COUNT), client))
    if options.receive_lanes == 1:
        return client()
    assert isinstance(options.receive_lanes, int)
    return ReceiveLanes(options.receive_lanes, client)
