"""One byte range of a file, one torrent: the unit a model's file is dealt in.

A node pulls range ``[offset, offset + length)`` of file F from the origin into its
partial file for F at that offset, and publishes the range as soon as it is written;
the others fetch it straight into *their* partial file for F at the same offset (each
byte written once, no scratch copy) and assemble F from its ranges.

libtorrent maps a torrent's file onto a whole file on disk, never onto a region of
one. So a range torrent describes the WHOLE file F (one file, F's full size S, v2,
private), and only the pieces inside the range carry real hashes; every other piece's
hash in the piece layer is ``FILLER``, a fixed value no data hashes to. Every torrent
added here sets piece priority 0 outside the range: nobody asks for those pieces, nobody
writes them, and the file keeps its size S and its other bytes. The seeder adds the
range's pieces as had (``have_pieces``, files not verified): it reads nothing of F to
start and hashes nothing but what ``make_range_torrent`` hashed, the range itself. Not
``seed_mode``: libtorrent 2.1 leaves seed mode for a torrent with a piece of priority 0,
and then holds no piece (or, were its files verified, hashes the whole file). And the
partial file must already be S bytes long: libtorrent sets a file it writes to the
torrent's size, cutting or extending it (``add_params`` refuses another size).

The torrent is built here, from BEP 52: SHA-256 of each 16 KiB block, each piece's
subtree root (its blocks' hashes padded with zero hashes to a piece's worth) in the
"piece layers", the layer padded to a power of two with the root of a piece of zero
hashes, and its merkle root as the file's "pieces root". The range itself travels in
the info dict (``aioloader range: [offset, length]``), so the info hash covers it, and
two ranges of one file are two torrents. A follower is given the torrent whole, its
piece layers checked against the root in the info dict (``served``): with the info dict
alone (``info_only``) libtorrent asks the seeder for the hashes it needs (BEP 52 hash
requests), and followers of a seeder whose uplink they share lost it after their first
pieces and never had it back ("no piece for 30 s" at every follower of the first range
published, on 8 nodes; three followers of a 16 MiB range of a 1 GiB file from a seeder
sending 5 MB/s, every time). The layer is 32 bytes a piece of the whole file, so a torrent
over ``SERVED_WHOLE`` (a file over 32 GiB in 1 MiB pieces) goes as its info dict alone.

Ranges are piece-aligned: ``offset`` and ``length`` are multiples of the piece, but the
file's tail, which ends at S. A file of one piece or less is one range, itself.

Calls here block (``make_range_torrent`` reads the range; ``add_params`` looks at the
partial file): run them in a thread.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from .bencode import Bencoded, bdecode, bencode
from .libtorrent_types import AddTorrentParams
from .torrents import libtorrent

__all__ = [
    "BLOCK",
    "FILLER",
    "RANGE_KEY",
    "SERVED_WHOLE",
    "RangeError",
    "add_params",
    "describe_range",
    "info_only",
    "make_range_torrent",
    "range_pieces",
    "served",
]

BLOCK = 16 << 10
"""The leaf of a v2 merkle tree: SHA-256 of each 16 KiB block."""

RANGE_KEY = b"aioloader range"
"""The info dict's key that holds ``[offset, length]``."""

FILLER = hashlib.sha256(b"aioloader range torrent: a piece outside the range").digest()
"""The piece layer's hash of every piece outside the range."""

_ZERO = bytes(32)
_INFO_KEYS = {b"file tree", b"meta version", b"name", b"piece length", b"private", RANGE_KEY}
_MAX_PIECE = 1 << 30


class RangeError(ValueError):
    """A range torrent is malformed, or does not fit the file it is for."""


# -- merkle trees (BEP 52) ---------------------------------------------------------------


def _pair(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(left + right).digest()


def _root(hashes: list[bytes], width: int, pad: bytes) -> bytes:
    """The merkle root over ``hashes`` padded with ``pad`` to ``width`` (a power of two)."""
    layer = hashes + [pad] * (width - len(hashes))
    while len(layer) > 1:
        layer = [_pair(layer[i], layer[i + 1]) for i in range(0, len(layer), 2)]
    return layer[0]


def _pad_root(leaves: int) -> bytes:
    """The root of a subtree of ``leaves`` zero hashes (a power of two)."""
    node = _ZERO
    while leaves > 1:
        node, leaves = _pair(node, node), leaves // 2
    return node


def _width(n: int) -> int:
    """The least power of two >= n."""
    return 1 << max(n - 1, 0).bit_length()


def _pieces(file_size: int, piece: int) -> int:
    return -(-file_size // piece)


def _check_piece(piece: int) -> None:
    if piece < BLOCK or piece > _MAX_PIECE or piece & (piece - 1):
        raise RangeError(f"piece length {piece} is not a power of two from 16 KiB to 1 GiB")


def _check_range(offset: int, length: int, file_size: int, piece: int) -> None:
    """``[offset, offset + length)`` is a non-empty, piece-aligned range inside the file."""
    _check_piece(piece)
    end = offset + length
    if file_size <= 0:
        raise RangeError(f"a range of an empty file ({file_size} bytes) holds nothing")
    if offset < 0 or length <= 0 or end > file_size:
        raise RangeError(
            f"range [{offset}, {end}) is not a non-empty range inside the file's {file_size} bytes"
        )
    if offset % piece or (end % piece and end != file_size):
        raise RangeError(
            f"range [{offset}, {end}) is not aligned to the piece ({piece} bytes): "
            "it must start on a piece and end on one or at the end of the file"
        )


def range_pieces(offset: int, length: int, piece: int) -> range:
    """The indices of the pieces of ``[offset, offset + length)``."""
    return range(offset // piece, -(-(offset + length) // piece))


def _hash_piece(fd: int, path: Path, start: int, size: int, leaves: int) -> list[bytes]:
    """The block hashes of ``size`` bytes at ``start`` of the file open as ``fd``, padded
    with zero hashes to ``leaves`` when ``leaves`` is not 0."""
    hashes: list[bytes] = []
    buffer = bytearray(min(size, 4 << 20))
    done = 0
    while done < size:
        want = min(len(buffer), size - done)
        view = memoryview(buffer)[:want]
        got = 0
        while got < want:
            n = os.preadv(fd, [view[got:]], start + done + got)
            if n == 0:
                raise RangeError(
                    f"{path}: ends before byte {start + done + got} "
                    f"of the range [{start}, {start + size})"
                )
            got += n
        hashes.extend(hashlib.sha256(view[i : i + BLOCK]).digest() for i in range(0, want, BLOCK))
        done += want
    return hashes + [_ZERO] * (leaves - len(hashes)) if leaves else hashes


def make_range_torrent(
    path: Path, offset: int, length: int, file_size: int, name: str, piece: int
) -> bytes:
    """The torrent of range ``[offset, offset + length)`` of the file at ``path`` (a
    partial file of ``file_size`` bytes), published under ``name`` (blocking: reads and
    hashes the range only).

    Raises:
        RangeError: the range is empty, outside the file or not piece-aligned, the
            piece is not a power of two, or the file at ``path`` is not ``file_size``
            bytes long.
        OSError: the file cannot be read.
    """
    _check_range(offset, length, file_size, piece)
    _check_name(name)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size != file_size:
            raise RangeError(
                f"{path}: {size} bytes, not the {file_size} of the file it holds a range "
                "of; size the partial file to the whole file before hashing a range"
            )
        leaves = piece // BLOCK
        if file_size <= piece:
            blocks = _hash_piece(file.fileno(), path, 0, file_size, 0)
            root = _root(blocks, _width(len(blocks)), _ZERO)
            layers: dict[bytes, Bencoded] = {}
        else:
            layer = [FILLER] * _pieces(file_size, piece)
            for index in range_pieces(offset, length, piece):
                start = index * piece
                blocks = _hash_piece(
                    file.fileno(), path, start, min(piece, file_size - start), leaves
                )
                layer[index] = _root(blocks, leaves, _ZERO)
            root = _root(layer, _width(len(layer)), _pad_root(leaves))
            layers = {root: b"".join(layer)}
    encoded = name.encode()
    info: dict[bytes, Bencoded] = {
        b"file tree": {encoded: {b"": {b"length": file_size, b"pieces root": root}}},
        b"meta version": 2,
        b"name": encoded,
        b"piece length": piece,
        b"private": 1,
        RANGE_KEY: [offset, length],
    }
    torrent: dict[bytes, Bencoded] = {b"created by": b"aioloader", b"info": info}
    if layers:
        torrent[b"piece layers"] = layers
    return bencode(torrent)


def _decoded(torrent: bytes) -> Bencoded:
    try:
        return bdecode(torrent)
    except ValueError as exc:
        raise RangeError(str(exc)) from None


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise RangeError(f"torrent name {name!r} is not a plain file name")


def _dict(value: Bencoded | None, what: str) -> dict[bytes, Bencoded]:
    if not isinstance(value, dict):
        raise RangeError(f"{what} is not a dict")
    return value


def _int(value: Bencoded | None, what: str) -> int:
    if not isinstance(value, int):
        raise RangeError(f"{what} is not an integer")
    return value


def describe_range(torrent: bytes) -> tuple[str, int, int, int, int]:
    """(name, file size, offset, length, piece) of a range torrent, checked: v2 only,
    private, one file, the range piece-aligned and inside the file; where the torrent
    carries its piece layer, that layer hashes to the file's root and holds real hashes
    exactly on the range's pieces (``FILLER`` on all others). A torrent without piece
    layers (``info_only``) is checked as far as its info dict goes: libtorrent checks
    each hash a peer sends against its root.

    Raises:
        RangeError: any of the above does not hold, saying which.
    """
    top = _dict(_decoded(torrent), "the torrent")
    info = _dict(top.get(b"info"), "the torrent's info")
    if set(info) != _INFO_KEYS:
        raise RangeError(
            f"the info dict's keys are {sorted(info)}, not a range torrent's {sorted(_INFO_KEYS)}"
        )
    if info[b"meta version"] != 2:
        raise RangeError("it is not a v2 torrent (meta version 2)")
    if info[b"private"] != 1:
        raise RangeError("it is not private")
    piece = _int(info[b"piece length"], "the piece length")
    _check_piece(piece)
    raw_name = info[b"name"]
    tree = _dict(info[b"file tree"], "the file tree")
    if not isinstance(raw_name, bytes) or list(tree) != [raw_name]:
        raise RangeError("its file tree does not hold exactly one file, named as the torrent")
    try:
        name = raw_name.decode()
    except UnicodeDecodeError:
        raise RangeError(f"its name {raw_name[:64]!r} is not UTF-8") from None
    _check_name(name)
    node = _dict(_dict(tree[raw_name], "the file's node").get(b""), "the file's entry")
    file_size = _int(node.get(b"length"), "the file's length")
    root = node.get(b"pieces root")
    if not isinstance(root, bytes) or len(root) != 32 or set(node) != {b"length", b"pieces root"}:
        raise RangeError("the file's entry is not a length and a 32-byte pieces root")
    bounds = info[RANGE_KEY]
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise RangeError(f"{RANGE_KEY.decode()} is not [offset, length]")
    offset, length = _int(bounds[0], "the range's offset"), _int(bounds[1], "the range's length")
    _check_range(offset, length, file_size, piece)
    if b"piece layers" in top:
        _check_layer(
            _dict(top[b"piece layers"], "the piece layers"), root, file_size, offset, length, piece
        )
    _parsed(torrent)
    return name, file_size, offset, length, piece


def _check_layer(
    layers: Mapping[bytes, Bencoded],
    root: bytes,
    file_size: int,
    offset: int,
    length: int,
    piece: int,
) -> None:
    if file_size <= piece:
        if layers:
            raise RangeError("a file of one piece has no piece layer, and this one has")
        return
    layer = layers.get(root)
    count = _pieces(file_size, piece)
    if list(layers) != [root] or not isinstance(layer, bytes) or len(layer) != 32 * count:
        raise RangeError(
            f"its piece layers are not one layer of {count} hashes for the file's root"
        )
    hashes = [layer[i : i + 32] for i in range(0, len(layer), 32)]
    if _root(hashes, _width(count), _pad_root(piece // BLOCK)) != root:
        raise RangeError("its piece layer does not hash to the file's pieces root")
    inside = range_pieces(offset, length, piece)
    wrong = [i for i, h in enumerate(hashes) if (h == FILLER) == (i in inside)]
    if wrong:
        raise RangeError(
            f"its piece layer's real hashes are not exactly the range's pieces "
            f"{inside.start}-{inside.stop - 1} (piece {wrong[0]} is not)"
        )


def _parsed(torrent: bytes) -> None:
    """libtorrent accepts it, too."""
    try:
        libtorrent().torrent_info(torrent)
    except RuntimeError as exc:
        raise RangeError(f"libtorrent refuses the torrent ({exc})") from None


def info_only(torrent: bytes) -> bytes:
    """The torrent without its piece layers: its info dict, all a follower needs (it asks
    the seeder for the hashes, and checks them against the root in the info dict)."""
    top = _dict(_decoded(torrent), "the torrent")
    return bencode({b"info": _dict(top.get(b"info"), "the torrent's info")})


def has_layers(torrent: bytes) -> bool:
    """Whether ``torrent`` carries its piece layers (a full torrent, which a node can seed
    from a file it holds), not its info dict alone."""
    return b"piece layers" in _dict(_decoded(torrent), "the torrent")


SERVED_WHOLE = 1 << 20
"""The largest range torrent given to followers whole, piece layers included (a file of
32 GiB in 1 MiB pieces); a larger one goes as its info dict alone (see the module)."""


def served(torrent: bytes) -> bytes:
    """What followers are given of ``torrent``: all of it up to ``SERVED_WHOLE`` bytes,
    else its info dict alone (``info_only``)."""
    return torrent if len(torrent) <= SERVED_WHOLE else info_only(torrent)


def add_params(torrent: bytes, into: Path, *, seed: bool) -> AddTorrentParams:
    """What the session adds ``torrent`` with, to seed its range from, or fetch it into,
    the partial file ``into`` (blocking: looks at its size).

    Pieces outside the range have priority 0 (never asked for nor written); the file is
    not verified (nothing of it is read to add it). To seed, the range's pieces are
    taken for had: the caller wrote them, and ``make_range_torrent`` hashed them from it.

    Raises:
        RangeError: the torrent is not a range torrent, or ``into`` is not the size of
            the file it describes (libtorrent would truncate or extend it).
        OSError: ``into`` cannot be looked at (missing: make and size it first).
    """
    _, file_size, offset, length, piece = describe_range(torrent)
    size = os.stat(into).st_size
    if size != file_size:
        raise RangeError(
            f"{into}: {size} bytes, but the range torrent [{offset}, {offset + length}) is "
            f"of a file of {file_size} bytes; a partial file must be sized to its whole "
            "file (is the torrent for another version of the file?)"
        )
    lt = libtorrent()
    inside = range_pieces(offset, length, piece)
    count = _pieces(file_size, piece)
    params = lt.add_torrent_params()
    params.ti = lt.torrent_info(torrent)
    params.save_path = str(into.parent)
    params.renamed_files = {0: into.name}
    params.piece_priorities = [4 if i in inside else 0 for i in range(count)]
    flags = lt.torrent_flags.default_flags & ~lt.torrent_flags.auto_managed
    flags |= lt.torrent_flags.duplicate_is_error | lt.torrent_flags.no_verify_files
    if seed:
        params.have_pieces = [i in inside for i in range(count)]
    params.flags = flags
    return params
