"""What a URL designates, normalised for comparison: scheme, host, port and path
segments (pure; no I/O).

The daemon's allow-list (daemon/allow.py) compares a URL and its prefixes in this
form, part by part and never as strings; a ``Location`` (stores.py) carries the
parts of its URL, worked out once, so that the check judges the value the fetch
then reads:

- scheme and host are lower-cased; a host is kept as written (no IDNA conversion
  either way, so a Unicode host and its ``xn--`` form differ); the port is made
  explicit (80 for http, 443 for https);
- the path is percent-decoded once and empty segments dropped;
- the query string and fragment play no part.

Refused (``UnsafeUrlError``): user info, ``.`` and ``..`` segments, written or
encoded, encoded slashes and backslashes, a percent sign still encoding something
after decoding, backslashes and control characters: each can make a server, proxy
or client library see another path or host than a check of these parts saw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["DEFAULT_PORTS", "UnsafeUrlError", "UrlParts", "url_parts"]

DEFAULT_PORTS = {"http": 80, "https": 443}
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
_STILL_ENCODED = re.compile(r"%[0-9a-f]{2}", re.IGNORECASE)
# "." and "..", also with a ";parameter" that some servers strip (Tomcat's "..;").
_DOT_SEGMENT = re.compile(r"\.{1,2}(;.*)?")


class UnsafeUrlError(ValueError):
    """A URL whose meaning may change after a check (user info, dot segments ...)."""


@dataclass(frozen=True)
class UrlParts:
    """What a URL designates, normalised for comparison (see the module docstring)."""

    scheme: str
    host: str
    port: int | None
    segments: tuple[str, ...]

    def within(self, prefix: UrlParts) -> bool:
        """Whether these parts are ``prefix`` or below it, segment by segment."""
        origin = (self.scheme, self.host, self.port)
        same_origin = origin == (prefix.scheme, prefix.host, prefix.port)
        return same_origin and self.segments[: len(prefix.segments)] == prefix.segments


def url_parts(url: str) -> UrlParts:
    """The scheme, host, port and decoded path segments of ``url``.

    Raises:
        UnsafeUrlError: it has user info, dot segments, encoded separators, control
            characters or backslashes, no host, or an invalid port.
    """
    if any(ord(c) <= 0x20 or c == "\x7f" for c in url):
        raise UnsafeUrlError("it holds whitespace or a control character")
    if "\\" in url.split("?", 1)[0]:
        raise UnsafeUrlError("it holds a backslash")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced "[" in the host, say
        raise UnsafeUrlError(f"it cannot be parsed ({exc})") from None
    if "@" in parts.netloc:
        raise UnsafeUrlError("it names a user (user info before '@' is not allowed)")
    host = (parts.hostname or "").lower()
    if not host:
        raise UnsafeUrlError("it names no host or bucket")
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        raise UnsafeUrlError("its port is not a number from 0 to 65535") from None
    if port is None:
        port = DEFAULT_PORTS.get(scheme)
    return UrlParts(scheme, host, port, _segments(parts.path))


def _segments(path: str) -> tuple[str, ...]:
    if _ENCODED_SEPARATOR.search(path):
        raise UnsafeUrlError("its path holds an encoded '/' or '\\' (%2F, %5C)")
    decoded = unquote(path)
    if any(ord(c) < 0x20 or c == "\x7f" for c in decoded) or "\\" in decoded:
        raise UnsafeUrlError("its decoded path holds a control character or a backslash")
    if _STILL_ENCODED.search(decoded):
        raise UnsafeUrlError("its path is percent-encoded twice (such as %252e)")
    segments = tuple(s for s in decoded.split("/") if s)
    if any(_DOT_SEGMENT.fullmatch(s) for s in segments):
        raise UnsafeUrlError("its path has a '.' or '..' segment (also as %2e)")
    return segments
