"""The daemon's allow-list: which URLs it may fetch (pure; no I/O).

What the daemon is asked to fetch arrives as a ``Location`` (sources/stores.py),
parsed once by the POST (or the preload's check) and then handed to the fetch: the
list judges that value, the same one the fetch reads. A prefix and a URL are
compared in their normalised parts (sources/url_parts.py: scheme, host, port and
path segments; a ``Location`` carries its own), part by part, never as strings:

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

The daemon checks every location it is asked for, and passes the allow-list to its
HTTP/S3 source as ``HttpOptions.url_policy``, which calls it on each shard an
index names and each redirect target (URLs the fetch made or was sent to, parsed
here) before sending a request there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import AccessDeniedError, ConfigError
from ..redact import redact
from ..sources.hf.url import HfLocation, is_commit, parse_hf_url
from ..sources.stores import Location, locate
from ..sources.url_parts import DEFAULT_PORTS, UnsafeUrlError, UrlParts, url_parts

__all__ = [
    "AllowList",
    "HfPrefix",
    "UnsafeUrlError",
    "UrlNotAllowedError",
    "parse_hf_prefix",
]


class UrlNotAllowedError(AccessDeniedError):
    """The daemon may not fetch this URL: it is outside the allowed prefixes or unsafe."""


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


class AllowList:
    """The URL prefixes the daemon may fetch from; empty: any URL.

    Calling it checks a URL, so it serves as ``HttpOptions(url_policy=allow_list)``.

    Raises:
        ConfigError: a prefix is not an absolute URL, or is unsafe itself.
    """

    def __init__(self, prefixes: Iterable[str] = ()) -> None:
        self.prefixes = tuple(prefixes)
        parsed = [self._parse_prefix(p) for p in self.prefixes]
        self._locations = tuple(p for p in parsed if isinstance(p, UrlParts))
        self._hub = tuple(p for p in parsed if isinstance(p, HfPrefix))

    @staticmethod
    def _parse_prefix(prefix: str) -> UrlParts | HfPrefix:
        if not isinstance(prefix, str):
            raise ConfigError(f"an allowed prefix must be a str, not {type(prefix).__name__}")
        if _is_hf(prefix):
            try:
                return parse_hf_prefix(prefix)
            except ConfigError as exc:
                raise ConfigError(f"allowed prefix {prefix!r} is refused: {exc}") from None
        try:
            location = url_parts(prefix)
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

    def refusal(self, where: Location | str) -> str | None:
        """Why ``where`` may not be fetched, or None when it may.

        A ``Location`` (what the daemon was asked for) is judged by the place on the
        Hub or the parts it carries, the value its fetch then reads; a str (a URL a
        fetch is about to request: a shard, a redirect target) is parsed here.
        """
        if not self.prefixes:
            return None
        url = where if isinstance(where, str) else where.first
        if _is_hf(url):
            try:
                hub = parse_hf_url(url) if isinstance(where, str) else where.hf
            except ConfigError as exc:
                return f"it is not a well-formed hf:// URL ({exc})"
            if hub is not None and self._allows(hub):
                return None
            return "it is outside the allowed prefixes"
        try:
            location = url_parts(url) if isinstance(where, str) else where.parts
        except UnsafeUrlError as exc:
            return str(exc)
        if any(location.within(prefix) for prefix in self._locations):
            return None
        return "it is outside the allowed prefixes"

    def check(self, where: Location | str) -> None:
        """Return if the daemon may fetch ``where`` (see ``refusal``).

        Raises:
            UrlNotAllowedError: it may not; the message names the URL (redacted).
        """
        reason = self.refusal(where)
        if reason is not None:
            url = where if isinstance(where, str) else where.first
            raise UrlNotAllowedError(
                f"{url} may not be fetched: {reason}; ask the operator to add its prefix "
                "to --allow-prefix / AIOLOADER_ALLOW_PREFIXES (each shard and redirect "
                "target must be inside one too)"
            )

    __call__ = check

    def for_fetch(self, asked: Location | str) -> Callable[[str], None]:
        """The policy of one fetch of ``asked``, a location this list allows (a str is
        located here).

        It is this list, and for an hf:// model it also lets the fetch read its own
        repository at a commit sha wherever the revision it asked for is allowed
        (the source reads a branch's or tag's files at the commit it resolved to),
        and follow the Hub's redirects to its storage host (see the module docstring).
        """
        origin = (asked if isinstance(asked, Location) else locate(asked)).hf
        if not self.prefixes or origin is None:
            return self.check

        def check(url: str) -> None:
            if not _is_hf(url):
                _check_hub_redirect(url)
                return
            try:
                place = parse_hf_url(url)
            except ConfigError:
                place = None
            if place is not None and (
                self._allows(place)
                or (
                    place.repo_id.lower() == origin.repo_id.lower()
                    and is_commit(place.revision)
                    and self._allows(place.at(revision=origin.revision))
                )
            ):
                return
            self.check(url)  # refused: raises, naming why

        return check

    def _allows(self, place: HfLocation) -> bool:
        return any(prefix.allows(place) for prefix in self._hub)


def _check_hub_redirect(url: str) -> None:
    """Return if ``url``, where the Hub redirected an allowed hf:// fetch, is a safe
    http(s) URL (no user info, dot segments, encoded separators, control characters).

    Raises:
        UrlNotAllowedError: it is not.
    """
    try:
        location = url_parts(url)
    except UnsafeUrlError as exc:
        raise UrlNotAllowedError(
            f"{url}, where the Hub redirected, may not be fetched: {exc}"
        ) from None
    if location.scheme not in DEFAULT_PORTS:
        raise UrlNotAllowedError(
            f"{url}, where the Hub redirected, may not be fetched: not an http(s) URL"
        )
