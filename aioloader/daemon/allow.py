"""The daemon's allow-list: which URLs it may fetch (pure; no I/O).

A prefix and a URL are both parsed into scheme, host, port and path segments,
and compared part by part, never as strings:

- scheme and host are lower-cased; a host is compared as written (no IDNA
  conversion either way, so a Unicode host and its ``xn--`` form differ: refused,
  never confused); the port is made explicit (80 for http, 443 for https);
- the path is percent-decoded once, empty segments dropped, and compared segment
  by segment: ``https://h/models`` allows ``https://h/models`` and
  ``https://h/models/x``, not ``https://h/models-evil/x``;
- the query string and fragment play no part.

``hf://`` URLs are compared as what they name on the Hub (sources/hf/url.py):
owner, repository name (both case-insensitive, as the Hub looks them up),
revision and path segments. ``hf://org/`` allows every repository of ``org``;
``hf://org/name`` any revision of that repository (``hf://org/na`` is another
repository, never a prefix of ``hf://org/name``); ``hf://org/name@v1`` only the
revision ``v1``, as written. A load reads a branch's or tag's files at the commit
it resolved to, so ``for_fetch`` lets one fetch read its own repository at a
commit sha where the revision it asked for is allowed. An allowed ``hf://`` model
is fetched from wherever the Hub serves it: its ``resolve`` URLs redirect to a
storage host (``cdn-lfs.hf.co``, ``cas-bridge.xethub.hf.co``, a mirror's own),
and ``for_fetch`` lets the fetch follow them. Every request of an ``hf://``
fetch goes to the Hub's endpoint (``HF_ENDPOINT``, the operator's setting, never
a client's) or to where the Hub redirects it, so the Hub, which the prefix
trusts, names those hosts; each target must still be a safe ``http(s)`` URL
(below).

Refused outright, whatever the prefixes: user info (``https://allowed@other/``),
``.`` and ``..`` segments, written or encoded (``%2e%2e``), encoded slashes and
backslashes (``..%2f``), a percent sign still encoding something after decoding
(``%252e``), backslashes and control characters: each can make a server, proxy or
client library see another path or host than this check saw.

The daemon checks every URL it is asked for, and passes the allow-list to its
HTTP/S3 source as ``HttpOptions.url_policy``, which calls it on each shard an
index names and each redirect target before sending a request there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ..errors import AccessDeniedError, ConfigError
from ..redact import redact
from ..sources.hf.url import HfLocation, is_commit, parse_hf_url

__all__ = [
    "AllowList",
    "HfPrefix",
    "Location",
    "UnsafeUrlError",
    "UrlNotAllowedError",
    "parse_hf_prefix",
    "parse_location",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
_STILL_ENCODED = re.compile(r"%[0-9a-f]{2}", re.IGNORECASE)
# "." and "..", also with a ";parameter" that some servers strip (Tomcat's "..;").
_DOT_SEGMENT = re.compile(r"\.{1,2}(;.*)?")


class UnsafeUrlError(ValueError):
    """A URL whose meaning may change after this check (user info, dot segments ...)."""


class UrlNotAllowedError(AccessDeniedError):
    """The daemon may not fetch this URL: it is outside the allowed prefixes or unsafe."""


@dataclass(frozen=True)
class Location:
    """What a URL designates, normalised for comparison."""

    scheme: str
    host: str
    port: int | None
    segments: tuple[str, ...]

    def within(self, prefix: Location) -> bool:
        """Whether this location is ``prefix`` or below it, segment by segment."""
        origin = (self.scheme, self.host, self.port)
        same_origin = origin == (prefix.scheme, prefix.host, prefix.port)
        return same_origin and self.segments[: len(prefix.segments)] == prefix.segments


def parse_location(url: str) -> Location:
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
        port = _DEFAULT_PORTS.get(scheme)
    return Location(scheme, host, port, _segments(parts.path))


@dataclass(frozen=True)
class HfPrefix:
    """An allowed part of the Hub: an owner, a repository, a revision, a folder.

    ``name`` and ``revision`` are None where the prefix leaves them open; the
    owner and name are lower-cased.
    """

    owner: str
    name: str | None = None
    revision: str | None = None
    segments: tuple[str, ...] = ()

    def allows(self, location: HfLocation) -> bool:
        """Whether ``location`` is this prefix or below it, part by part."""
        owner, _, name = location.repo_id.lower().partition("/")
        segments = tuple(location.path.split("/")) if location.path else ()
        return (
            owner == self.owner
            and self.name in (None, name)
            and self.revision in (None, location.revision)
            and segments[: len(self.segments)] == self.segments
        )


def parse_hf_prefix(prefix: str) -> HfPrefix:
    """``hf://org/``, ``hf://org/name``, ``hf://org/name@revision[/folder]``.

    Raises:
        ConfigError: not a well-formed hf:// URL (sources/hf/url.py's rules).
    """
    rest = prefix[len("hf://") :].rstrip("/")
    if rest and "/" not in rest:
        # An owner alone: checked by the rules of a repository URL of that owner.
        owner = parse_hf_url(f"hf://{rest}/{rest}").repo_id.partition("/")[0]
        return HfPrefix(owner.lower())
    location = parse_hf_url(prefix)
    owner, _, name = location.repo_id.lower().partition("/")
    pinned = "@" in rest.split("/")[1]  # else parse_hf_url filled in "main"
    segments = tuple(location.path.split("/")) if location.path else ()
    return HfPrefix(owner, name, location.revision if pinned else None, segments)


def _is_hf(url: str) -> bool:
    return url[:5].lower() == "hf://"


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


class AllowList:
    """The URL prefixes the daemon may fetch from; empty: any URL.

    Calling it checks a URL, so it serves as ``HttpOptions(url_policy=allow_list)``.

    Raises:
        ConfigError: a prefix is not an absolute URL, or is unsafe itself.
    """

    def __init__(self, prefixes: Iterable[str] = ()) -> None:
        self.prefixes = tuple(prefixes)
        parsed = [self._parse_prefix(p) for p in self.prefixes]
        self._locations = tuple(p for p in parsed if isinstance(p, Location))
        self._hub = tuple(p for p in parsed if isinstance(p, HfPrefix))

    @staticmethod
    def _parse_prefix(prefix: str) -> Location | HfPrefix:
        if not isinstance(prefix, str):
            raise ConfigError(f"an allowed prefix must be a str, not {type(prefix).__name__}")
        if _is_hf(prefix):
            try:
                return parse_hf_prefix(prefix)
            except ConfigError as exc:
                raise ConfigError(f"allowed prefix {prefix!r} is refused: {exc}") from None
        try:
            location = parse_location(prefix)
        except UnsafeUrlError as exc:
            raise ConfigError(f"allowed prefix {redact(prefix)!r} is refused: {exc}") from None
        parts = urlsplit(prefix)
        if not parts.scheme or parts.query or parts.fragment:
            raise ConfigError(
                f"allowed prefix {redact(prefix)!r} must be a URL without query or fragment, "
                "such as s3://bucket/models/ or https://host/models/"
            )
        return location

    def __repr__(self) -> str:
        return f"AllowList({self.prefixes!r})"

    def __bool__(self) -> bool:
        return bool(self.prefixes)

    def refusal(self, url: str) -> str | None:
        """Why ``url`` may not be fetched, or None when it may."""
        if not self.prefixes:
            return None
        if _is_hf(url):
            try:
                hub = parse_hf_url(url)
            except ConfigError as exc:
                return f"it is not a well-formed hf:// URL ({exc})"
            if any(prefix.allows(hub) for prefix in self._hub):
                return None
            return "it is outside the allowed prefixes"
        try:
            location = parse_location(url)
        except UnsafeUrlError as exc:
            return str(exc)
        if any(location.within(prefix) for prefix in self._locations):
            return None
        return "it is outside the allowed prefixes"

    def check(self, url: str) -> None:
        """Return if the daemon may fetch ``url``.

        Raises:
            UrlNotAllowedError: it may not; the message names the URL (redacted).
        """
        reason = self.refusal(url)
        if reason is not None:
            raise UrlNotAllowedError(
                f"{url} may not be fetched: {reason}; ask the operator to add its prefix "
                "to --allow-prefix / AIOLOADER_ALLOW_PREFIXES (each shard and redirect "
                "target must be inside one too)"
            )

    __call__ = check

    def for_fetch(self, asked: str) -> Callable[[str], None]:
        """The policy of one fetch of ``asked``, a URL this list allows.

        It is this list, and for an hf:// model it also lets the fetch read its own
        repository at a commit sha wherever the revision it asked for is allowed
        (the source reads a branch's or tag's files at the commit it resolved to),
        and follow the Hub's redirects to its storage host (see the module docstring).
        """
        if not self.prefixes or not _is_hf(asked):
            return self.check
        origin = parse_hf_url(asked)

        def check(url: str) -> None:
            if not _is_hf(url):
                _check_hub_redirect(url)
                return
            if self.refusal(url) is not None:
                try:
                    location = parse_hf_url(url)
                except ConfigError:
                    location = None
                if (
                    location is not None
                    and location.repo_id.lower() == origin.repo_id.lower()
                    and is_commit(location.revision)
                    and self.refusal(location.at(revision=origin.revision).url()) is None
                ):
                    return
            self.check(url)

        return check


def _check_hub_redirect(url: str) -> None:
    """Return if ``url``, where the Hub redirected an allowed hf:// fetch, is a safe
    http(s) URL (no user info, dot segments, encoded separators, control characters).

    Raises:
        UrlNotAllowedError: it is not.
    """
    try:
        location = parse_location(url)
    except UnsafeUrlError as exc:
        raise UrlNotAllowedError(
            f"{url}, where the Hub redirected, may not be fetched: {exc}"
        ) from None
    if location.scheme not in _DEFAULT_PORTS:
        raise UrlNotAllowedError(
            f"{url}, where the Hub redirected, may not be fetched: not an http(s) URL"
        )
