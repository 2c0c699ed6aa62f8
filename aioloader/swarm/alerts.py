"""What the swarm session's alerts say (``read``), read in the session's lane.

A call here is handed what it reads (the session, the torrents held, as the event loop
sees them when it asks) and returns what it found (``Alerts``), which the loop takes
in (session.py): nothing here touches the loop's state.

A file libtorrent cannot write or read (``file_error_alert``: a full disk, a file size
limit, an I/O error, a read-only file system) is this node's failure, not a peer's:
``local_error`` is the ``OSError`` it is. libtorrent 2.1 reports it by that alert only:
the torrent carries no error, and the pieces whose writes failed still count as had.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..redact import redacting_logger
from .libtorrent_types import (
    Alert,
    FileErrorAlert,
    Libtorrent,
    Session,
    TorrentAlert,
    TorrentHandle,
    TorrentStatus,
)
from .torrents import libtorrent

__all__ = ["Alerts", "SwarmStatistics", "TorrentCounts", "local_error", "read"]

logger = redacting_logger(__name__)

_ERRNO_CATEGORIES = ("system", "generic")  # error codes whose values are errno's
_UPDATE_WAIT = 0.5  # seconds a read waits for libtorrent's statuses at most


@dataclass(frozen=True)
class SwarmStatistics:
    """A snapshot: bytes in and out per info hash, peers banned and blocked."""

    downloaded: dict[str, int]
    uploaded: dict[str, int]
    banned: int
    blocked: int
    hash_failures: int


@dataclass(frozen=True)
class TorrentCounts:
    """One torrent's status as libtorrent last gave it: payload bytes in and out, their
    rates (libtorrent's own average over the last seconds), the peers connected, the
    bytes of the file checked and held (``done``) of those it wants (``wanted``), which
    pieces it holds, and its error ("" when none)."""

    downloaded: int = 0
    uploaded: int = 0
    download_rate: int = 0
    upload_rate: int = 0
    peers: int = 0
    done: int = 0
    wanted: int = 0
    pieces: tuple[bool, ...] = ()
    error: str = ""


@dataclass
class Alerts:
    """What one read of the session's alerts found."""

    counts: dict[str, TorrentCounts]  # info hash -> its counts, per torrent held
    banned: int = 0  # peers banned (their data failed a piece's hash)
    blocked: int = 0  # connections refused by the IP filter
    hash_failures: int = 0
    flushed: set[str] = field(default_factory=set)  # info hashes whose writes were flushed
    failed: dict[str, OSError] = field(default_factory=dict)  # info hash -> its file's error


def read(
    session: Session,
    handles: list[tuple[str, TorrentHandle]],
    known: Mapping[str, TorrentCounts],
    dials: Iterable[Callable[[], object]] = (),
) -> Alerts:
    """Pop the session's alerts; the counts of ``handles`` (info hash, handle) after them.
    First, ``dials``: downloads' redials of their peers (download.py), made here rather
    than in lane calls of their own (a handle taken out meanwhile refuses: suppressed).

    The counts come from one ``post_torrent_updates``, answered by libtorrent with the
    status of every torrent that changed since the last (``state_update_alert``); a
    torrent it leaves out keeps its counts in ``known`` (the last read's), and one not
    known yet is asked for its own. Asking every handle for its status cost 1 to 2.5 ms
    of CPU a read at 62 torrents (a node of 32 following a one-file model), 4 reads a
    second on each of 32 daemons on two vCPUs; one post costs 0.05 ms. Where libtorrent
    does not answer within ``_UPDATE_WAIT``, every handle is asked as before."""
    for dial in dials:
        dial()
    lt = libtorrent()
    found = Alerts({})
    updated: dict[str, TorrentStatus] = {}
    _take(lt, session.pop_alerts(), found, updated)  # posted before this read: older
    updated.clear()
    session.post_torrent_updates(lt.status_flags_t.query_pieces)
    deadline = time.monotonic() + _UPDATE_WAIT
    answered = False
    while not answered:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        session.wait_for_alert(max(1, int(left * 1000)))
        answered = _take(lt, session.pop_alerts(), found, updated)
    for key, handle in handles:
        status = updated.get(key)
        if status is None and answered and key in known:
            found.counts[key] = known[key]
            continue
        if status is None:
            status = handle.status(handle.query_pieces)
        found.counts[key] = TorrentCounts(
            int(status.total_payload_download),
            int(status.total_payload_upload),
            int(status.download_payload_rate),
            int(status.upload_payload_rate),
            int(status.num_peers),
            int(status.total_wanted_done),
            int(status.total_wanted),
            tuple(status.pieces),
            status.errc.message() if status.errc.value() else "",
        )
    return found


def _take(
    lt: Libtorrent, popped: list[Alert], found: Alerts, updated: dict[str, TorrentStatus]
) -> bool:
    """Take ``popped`` into ``found`` (the statuses of a ``state_update_alert`` into
    ``updated``); whether one was among them."""
    answered = False
    for alert in popped:
        if isinstance(alert, lt.state_update_alert):
            answered = True
            for status in alert.status:
                updated[str(status.info_hashes.v2)] = status
        elif isinstance(alert, lt.file_error_alert):
            found.failed.setdefault(key_of(alert), local_error(alert))
        elif isinstance(alert, lt.peer_ban_alert):
            found.banned += 1
            logger.warning("swarm: banned a peer: %s", alert.message())
        elif isinstance(alert, lt.peer_blocked_alert):
            found.blocked += 1
            logger.info("swarm: refused a peer outside the list: %s", alert.message())
        elif isinstance(alert, lt.hash_failed_alert):
            found.hash_failures += 1
        elif isinstance(alert, lt.cache_flushed_alert):
            found.flushed.add(key_of(alert))
        elif alert.category() & lt.alert_category.error:
            logger.warning("swarm: %s", alert.message())
    return answered


def local_error(alert: FileErrorAlert) -> OSError:
    """The ``OSError`` of a file libtorrent could not write or read: its errno where the
    error is the system's, and the file's path."""
    error = alert.error
    if error.category().name() in _ERRNO_CATEGORIES and error.value():
        return OSError(error.value(), error.message(), alert.filename())
    return OSError(f"{alert.filename()}: {error.message()}")


def key_of(alert: TorrentAlert) -> str:
    """The info hash (hex) of the torrent an alert is about."""
    return str(alert.handle.info_hashes().v2)
