"""One file, one torrent: v2 only (SHA-256 merkle trees, every piece checked on
arrival), private (no DHT, no peer exchange, no tracker).

A model's files are torrents of their own: a node that pulls a model from the origin
publishes each file as soon as it is in its cache, and the others start on it while
the next one downloads. Calls here block (hashing a file reads it whole): run them in
a thread. libtorrent is imported here only (``libtorrent()``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from ..errors import ConfigError
from .libtorrent_types import Libtorrent, TorrentInfo

T = TypeVar("T")

__all__ = ["MIN_PIECE", "describe", "info_hash", "libtorrent", "make_torrent", "piece_length"]

MIN_PIECE = 1 << 20
"""The smallest piece of a file over 64 MiB (fewer pieces: fewer messages, fewer hashes)."""

_LARGE = 64 << 20


def libtorrent() -> Libtorrent:
    """The libtorrent module, or a ConfigError naming the extra that brings it; typed as
    the members aioloader uses (libtorrent_types.py), narrowed here, once."""
    try:
        import libtorrent as lt
    except ImportError as exc:
        raise ConfigError(
            f"sharing models with peers (--peers) needs libtorrent ({exc}); install "
            "aioloader[swarm], or Debian's python3-libtorrent"
        ) from None
    return cast(Libtorrent, lt)


def make_torrent(path: Path, name: str) -> bytes:
    """The torrent of the file at ``path``, published under ``name`` (blocking: hashes it)."""
    lt = libtorrent()
    size = os.path.getsize(path)
    piece = MIN_PIECE if size > _LARGE else 0  # 0: libtorrent's choice
    creator = lt.create_torrent(
        [lt.create_file_entry(name, size)], piece, lt.create_torrent.v2_only
    )
    creator.set_priv(True)
    creator.set_creator("aioloader")
    with tempfile.TemporaryDirectory(prefix="aioloader-torrent-") as folder:
        # libtorrent finds the file by its name in the torrent: a link names it so.
        os.symlink(os.path.abspath(path), os.path.join(folder, name))
        lt.set_piece_hashes(creator, folder)
    return bytes(lt.bencode(creator.generate()))


def _info(torrent: bytes) -> TorrentInfo:
    lt = libtorrent()
    try:
        return lt.torrent_info(torrent)
    except RuntimeError as exc:
        raise ValueError(f"not a torrent ({exc})") from None


def _remembered(parse: Callable[[bytes], T]) -> Callable[[bytes], T]:
    """``parse``, a pure function of a torrent's bytes, remembering its last 1024 results
    by a digest of the bytes (not the bytes: a torrent may be 32 MiB). The same torrents
    are asked about all the time (each held file's on every look at what is seeded, a
    peer's on each fetch), and libtorrent parses a whole torrent each time, on the
    loop's thread. A torrent it refuses is not remembered; threads may ask at once."""
    known: OrderedDict[bytes, T] = OrderedDict()
    lock = threading.Lock()

    @functools.wraps(parse)
    def remembered(torrent: bytes) -> T:
        key = hashlib.blake2b(torrent, digest_size=32).digest()
        with lock:
            if key in known:
                known.move_to_end(key)
                return known[key]
        result = parse(torrent)
        with lock:
            known[key] = result
            if len(known) > 1024:
                known.popitem(last=False)
        return result

    return remembered


@_remembered
def describe(torrent: bytes) -> tuple[str, int]:
    """(file name, file size) of a one-file v2 private torrent.

    Raises:
        ValueError: not a torrent, not v2, not private, or not exactly one file.
    """
    info = _info(torrent)
    if not info.info_hashes().has_v2():
        raise ValueError("it is not a v2 torrent")
    if not info.priv():
        raise ValueError("it is not private")
    layout = info.layout()
    files = [
        i for i in range(layout.num_files()) if not layout.file_flags(i) & layout.flag_pad_file
    ]
    if files != [0]:
        raise ValueError("it does not hold exactly one file")
    return str(layout.file_path(0)), int(layout.file_size(0))


@_remembered
def piece_length(torrent: bytes) -> int:
    """The bytes of each piece (the last one may be shorter)."""
    return int(_info(torrent).piece_length())


@_remembered
def info_hash(torrent: bytes) -> str:
    """The v2 info hash, in hex."""
    return str(_info(torrent).info_hashes().v2)
