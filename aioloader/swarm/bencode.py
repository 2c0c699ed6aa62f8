"""Bencoding (BEP 3): a range torrent is ours to write, and a peer's to check
(range_torrents.py). Strict: dict keys sorted and unique, integers canonical, nothing
after the value, nesting bounded; a bool is not an integer."""

from __future__ import annotations

__all__ = ["Bencoded", "bdecode", "bencode"]

Bencoded = int | bytes | list["Bencoded"] | dict[bytes, "Bencoded"]


def bencode(value: Bencoded) -> bytes:
    """``value`` bencoded; dict keys in sorted order, as BEP 3 requires."""
    out: list[bytes] = []
    _encode(value, out)
    return b"".join(out)


def _encode(value: Bencoded, out: list[bytes]) -> None:
    if isinstance(value, bool):
        raise TypeError("bencode: a bool is not an integer here")
    if isinstance(value, int):
        out.append(b"i%de" % value)
    elif isinstance(value, bytes):
        out.append(b"%d:%s" % (len(value), value))
    elif isinstance(value, list):
        out.append(b"l")
        for item in value:
            _encode(item, out)
        out.append(b"e")
    else:
        out.append(b"d")
        for key in sorted(value):
            _encode(key, out)
            _encode(value[key], out)
        out.append(b"e")


def bdecode(data: bytes) -> Bencoded:
    """The value bencoded in ``data``: strict (one value, canonical integers, dict keys
    sorted and unique), so that what we check is what libtorrent hashes.

    Raises:
        RangeError: ``data`` is not exactly one canonical bencoded value.
    """
    try:
        value, end = _decode(data, 0, 0)
    except (IndexError, ValueError) as exc:
        raise ValueError(f"not a bencoded torrent ({exc})") from None
    if end != len(data):
        raise ValueError(f"not a bencoded torrent ({len(data) - end} bytes after its end)")
    return value


def _decode(data: bytes, at: int, depth: int) -> tuple[Bencoded, int]:
    if depth > 64:
        raise ValueError("nested too deep")
    head = data[at : at + 1]
    if head == b"i":
        end = data.index(b"e", at)
        text = data[at + 1 : end]
        if not text or text != b"%d" % int(text):
            raise ValueError(f"integer {text[:24]!r} at {at} is not canonical")
        return int(text), end + 1
    if head == b"l":
        items: list[Bencoded] = []
        at += 1
        while data[at : at + 1] != b"e":
            item, at = _decode(data, at, depth + 1)
            items.append(item)
        return items, at + 1
    if head == b"d":
        found: dict[bytes, Bencoded] = {}
        last: bytes | None = None
        at += 1
        while data[at : at + 1] != b"e":
            key, at = _decode(data, at, depth + 1)
            if not isinstance(key, bytes):
                raise ValueError(f"a dict key at {at} is not a string")
            if last is not None and key <= last:
                raise ValueError(f"dict key {key[:24]!r} out of order or repeated")
            found[key], at = _decode(data, at, depth + 1)
            last = key
        return found, at + 1
    if head.isdigit():
        colon = data.index(b":", at)
        text = data[at:colon]
        if text != b"%d" % int(text) or colon + 1 + int(text) > len(data):
            raise ValueError(f"string length {text[:24]!r} at {at} is wrong")
        end = colon + 1 + int(text)
        return data[colon + 1 : end], end
    raise ValueError(f"unexpected {head!r} at {at}")
