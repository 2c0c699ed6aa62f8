"""What aioloader uses of libtorrent, declared: libtorrent ships no type stubs.

Each protocol names exactly the members the swarm calls (session.py, alerts.py,
download.py, torrents.py, range_torrents.py, settings_pack.py); ``torrents.libtorrent()``
narrows the imported module to ``Libtorrent`` once, and every value it makes is typed
from there. A member used anew is declared here first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = [
    "AddTorrentParams",
    "Alert",
    "AlertCategory",
    "CreateTorrent",
    "Creator",
    "ErrorCategory",
    "ErrorCode",
    "FileEntry",
    "FileErrorAlert",
    "FileStorage",
    "InfoHashes",
    "IpFilter",
    "Libtorrent",
    "ListenAlert",
    "Session",
    "SocketTypes",
    "StateUpdateAlert",
    "StatusFlags",
    "TorrentAlert",
    "TorrentFlags",
    "TorrentHandle",
    "TorrentInfo",
    "TorrentStatus",
]

Settings = Mapping[str, str | int | bool]


class InfoHashes(Protocol):
    """A torrent's info hashes (v1 and v2)."""

    @property
    def v2(self) -> object:
        """The SHA-256 info hash (``str()`` gives its hex)."""

    def has_v2(self) -> bool: ...


class FileStorage(Protocol):
    """The files of a torrent."""

    @property
    def flag_pad_file(self) -> int: ...

    def num_files(self) -> int: ...

    def file_flags(self, index: int) -> int: ...

    def file_path(self, index: int) -> str: ...

    def file_size(self, index: int) -> int: ...


class TorrentInfo(Protocol):
    """A parsed torrent file (``torrent_info``)."""

    def info_hashes(self) -> InfoHashes: ...

    def priv(self) -> bool: ...

    def layout(self) -> FileStorage: ...

    def piece_length(self) -> int: ...

    def num_pieces(self) -> int: ...


class ErrorCategory(Protocol):
    """An error code's category: ``system``/``generic`` hold errno values."""

    def name(self) -> str: ...


class ErrorCode(Protocol):
    """A ``boost::system::error_code``: 0 is no error."""

    def value(self) -> int: ...

    def message(self) -> str: ...

    def category(self) -> ErrorCategory: ...


class TorrentStatus(Protocol):
    """A torrent's status (``torrent_handle.status``, ``state_update_alert.status``)."""

    @property
    def info_hashes(self) -> InfoHashes: ...

    @property
    def num_peers(self) -> int: ...

    @property
    def errc(self) -> ErrorCode: ...

    @property
    def pieces(self) -> Sequence[bool]: ...

    @property
    def total_wanted_done(self) -> int: ...

    @property
    def total_wanted(self) -> int: ...

    @property
    def total_payload_download(self) -> int: ...

    @property
    def total_payload_upload(self) -> int: ...

    @property
    def download_payload_rate(self) -> int: ...

    @property
    def upload_payload_rate(self) -> int: ...


class TorrentHandle(Protocol):
    """One torrent in a session."""

    @property
    def query_pieces(self) -> int:
        """The ``status`` flag that fills in ``pieces``."""

    def status(self, flags: int) -> TorrentStatus: ...

    def is_valid(self) -> bool: ...

    def resume(self) -> None: ...

    def connect_peer(self, endpoint: tuple[str, int]) -> None: ...

    def torrent_file(self) -> TorrentInfo: ...

    def prioritize_pieces(self, priorities: list[int]) -> None: ...

    def flush_cache(self) -> None: ...

    def info_hashes(self) -> InfoHashes: ...


class Alert(Protocol):
    """Something the session reports (``pop_alerts``)."""

    def message(self) -> str: ...

    def category(self) -> int: ...


class TorrentAlert(Alert, Protocol):
    """An alert about one torrent (``cache_flushed_alert``, ``file_error_alert``)."""

    @property
    def handle(self) -> TorrentHandle: ...


class FileErrorAlert(TorrentAlert, Protocol):
    """``file_error_alert``: a torrent's file could not be written or read."""

    @property
    def error(self) -> ErrorCode: ...

    def filename(self) -> str: ...


class StateUpdateAlert(Alert, Protocol):
    """``state_update_alert``: the statuses ``post_torrent_updates`` asked for."""

    @property
    def status(self) -> list[TorrentStatus]: ...


class ListenAlert(Alert, Protocol):
    """``listen_succeeded_alert`` and ``listen_failed_alert``."""

    @property
    def port(self) -> int: ...

    @property
    def socket_type(self) -> object: ...


class AddTorrentParams(Protocol):
    """What ``Session.add_torrent`` takes."""

    ti: TorrentInfo
    save_path: str
    renamed_files: dict[int, str]
    flags: int
    piece_priorities: list[int]
    have_pieces: list[bool]


class IpFilter(Protocol):
    """Address ranges and whether each may connect (0: allowed, 1: blocked)."""

    def add_rule(self, first: str, last: str, flags: int) -> None: ...


class Session(Protocol):
    """The libtorrent session."""

    def add_extension(self, name: str) -> None: ...

    def wait_for_alert(self, milliseconds: int) -> object: ...

    def post_torrent_updates(self, flags: int) -> None: ...

    def pop_alerts(self) -> list[Alert]: ...

    def set_ip_filter(self, rules: IpFilter) -> None: ...

    def add_torrent(self, params: AddTorrentParams) -> TorrentHandle: ...

    def remove_torrent(self, handle: TorrentHandle) -> None: ...

    def get_torrents(self) -> list[TorrentHandle]: ...

    def pause(self) -> None: ...


class FileEntry(Protocol):
    """A file of a torrent being made (``create_file_entry``)."""


class Creator(Protocol):
    """A torrent being made (``create_torrent``)."""

    def set_priv(self, private: bool) -> None: ...

    def set_creator(self, name: str) -> None: ...

    def generate(self) -> object: ...


class CreateTorrent(Protocol):
    """The ``create_torrent`` class: called, it makes a ``Creator``."""

    @property
    def v2_only(self) -> int: ...

    def __call__(self, files: list[FileEntry], piece_size: int, flags: int) -> Creator: ...


class TorrentFlags(Protocol):
    """The ``torrent_flags`` a torrent is added with."""

    @property
    def default_flags(self) -> int: ...

    @property
    def auto_managed(self) -> int: ...

    @property
    def duplicate_is_error(self) -> int: ...

    @property
    def seed_mode(self) -> int: ...

    @property
    def no_verify_files(self) -> int: ...


class AlertCategory(Protocol):
    """The ``alert_category`` bits of the session's alert mask."""

    @property
    def error(self) -> int: ...

    @property
    def status(self) -> int: ...

    @property
    def peer(self) -> int: ...

    @property
    def ip_block(self) -> int: ...

    @property
    def storage(self) -> int: ...


class StatusFlags(Protocol):
    """The ``status_flags_t`` values: what a status read fills in."""

    @property
    def query_pieces(self) -> int: ...


class SocketTypes(Protocol):
    """The ``socket_type_t`` values a listening socket may have."""

    @property
    def tcp(self) -> object: ...

    @property
    def tcp_ssl(self) -> object: ...


class Libtorrent(Protocol):
    """The libtorrent module, as far as aioloader uses it."""

    @property
    def torrent_flags(self) -> TorrentFlags: ...

    @property
    def alert_category(self) -> AlertCategory: ...

    @property
    def socket_type_t(self) -> SocketTypes: ...

    @property
    def create_torrent(self) -> CreateTorrent: ...

    @property
    def listen_failed_alert(self) -> type[ListenAlert]: ...

    @property
    def listen_succeeded_alert(self) -> type[ListenAlert]: ...

    @property
    def peer_ban_alert(self) -> type[Alert]: ...

    @property
    def peer_blocked_alert(self) -> type[Alert]: ...

    @property
    def hash_failed_alert(self) -> type[TorrentAlert]: ...

    @property
    def cache_flushed_alert(self) -> type[TorrentAlert]: ...

    @property
    def file_error_alert(self) -> type[FileErrorAlert]: ...

    @property
    def state_update_alert(self) -> type[StateUpdateAlert]: ...

    @property
    def status_flags_t(self) -> StatusFlags: ...

    def session(self, settings: Settings, flags: int) -> Session: ...

    def ip_filter(self) -> IpFilter: ...

    def add_torrent_params(self) -> AddTorrentParams: ...

    def torrent_info(self, torrent: bytes) -> TorrentInfo: ...

    def create_file_entry(self, name: str, size: int) -> FileEntry: ...

    def set_piece_hashes(self, creator: Creator, folder: str) -> None: ...

    def bencode(self, value: object) -> bytes: ...
