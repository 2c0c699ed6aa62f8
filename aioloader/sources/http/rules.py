"""The rules of HTTP that remote reads follow, as plain functions that never await.

What a status means (retry, throttle, changed object, a plain failure), the file
size from ``Content-Range`` / ``Content-Length``, ``Retry-After``, strong ETags,
the refusal of encoded bodies, version pinning and which redirects are followed.
The transport and the readers (transport.py, store.py) apply them; here they
can be tested exhaustively without a server.
"""

from __future__ import annotations

import email.utils
import enum
import re
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple
from urllib.parse import urljoin, urlparse, urlsplit

from ...errors import AccessDeniedError, ConfigError, NotFoundError, ObjectChangedError, SourceError
from ..opening import PROBE_SIZE
from .retry import RetryableError

__all__ = [
    "MAX_REDIRECTS",
    "MAX_SMALL_READ",
    "PROBE_SIZE",
    "REDIRECT_STATUSES",
    "ContentRange",
    "Verdict",
    "check_encoding",
    "check_url",
    "check_same_range",
    "check_same_etag",
    "check_small_read",
    "classify_status",
    "parse_content_range",
    "parse_retry_after",
    "pin_headers",
    "redirect_target",
    "same_origin",
    "size_of",
    "status_error",
    "strong_etag",
    "too_many_redirects",
]

MAX_REDIRECTS = 10
# The most bytes read into a new ``bytes`` at once: headers (at most 100 MB) and index
# files are far smaller; only a server lying about a size asks for more.
MAX_SMALL_READ = 256 * 1024 * 1024
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_RETRY_STATUSES = frozenset({408, 425, 500, 502, 504})
_THROTTLE_STATUSES = frozenset({429, 503})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class Verdict(enum.Enum):
    """What a response status means for the request that got it."""

    OK = "ok"  # 200 / 206: read the body
    THROTTLED = "throttled"  # 429 / 503: retry, and ask the server less
    RETRY = "retry"  # a transient failure: retry
    CHANGED = "changed"  # 412: the pinned version is gone
    FAILED = "failed"  # anything else: give up, with the body's detail in the message


def classify_status(status: int) -> Verdict:
    """The Verdict on ``status``."""
    if status in (200, 206):
        return Verdict.OK
    if status in _THROTTLE_STATUSES:
        return Verdict.THROTTLED
    if status in _RETRY_STATUSES or 500 <= status < 600:
        return Verdict.RETRY
    if status == 412:
        return Verdict.CHANGED
    return Verdict.FAILED


def status_error(
    url: str, status: int, headers: Mapping[str, str], pinned: str | None
) -> Exception | None:
    """The error for a status that needs no body to explain it.

    Returns:
        ``None`` for ``200`` / ``206`` and for the statuses whose message needs the
        body's detail (see ``failure``); else the error to raise: a RetryableError
        for throttling and transient failures, ObjectChangedError for ``412``.
    """
    verdict = classify_status(status)
    if verdict is Verdict.THROTTLED:
        return RetryableError(
            f"HTTP {status} (server is throttling)", throttled=True,
            retry_after=parse_retry_after(headers.get("Retry-After")),
        )  # fmt: skip
    if verdict is Verdict.RETRY:
        return RetryableError(f"HTTP {status}")
    if verdict is Verdict.CHANGED:
        return ObjectChangedError(
            f"{url} changed on the server after the load started (version {pinned} is gone); "
            "tensors from two versions must not be mixed: load again"
        )
    return None


def failure(
    url: str,
    status: int,
    detail: str,
    location: str | None,
    describe_denied: Callable[[str, int, str], str],
) -> SourceError:
    """The error for a status classified FAILED, given the detail its body gave.

    Args:
        describe_denied: writes the message for ``401`` / ``403`` (what credentials
            were sent, what to check), from the URL, status and detail.
    """
    if status in (401, 403):
        return AccessDeniedError(describe_denied(url, status, detail))
    if status == 404:
        return NotFoundError(f"{url} does not exist (HTTP 404 {detail}); check the URL")
    if 300 <= status < 400:
        return SourceError(
            f"{url}: HTTP {status} {detail} redirect to {location} "
            "was not followed; use the final URL"
        )
    return SourceError(f"{url}: unexpected HTTP {status} {detail}")


class ContentRange(NamedTuple):
    """A parsed ``Content-Range: bytes start-end/total`` (``total`` None for ``*``)."""

    start: int
    end: int
    total: int | None


def parse_content_range(value: str | None) -> ContentRange | None:
    """``bytes 0-9/100`` -> ContentRange(0, 9, 100); None when it is not of that form."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        return None
    total = match.group(3)
    return ContentRange(
        int(match.group(1)), int(match.group(2)), None if total == "*" else int(total)
    )


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` (seconds or an HTTP date), never negative.

    Args:
        now: the current time as a Unix timestamp (default: ``time.time()``).
    """
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def strong_etag(value: str | None) -> str | None:
    """The ETag if it is strong: ``If-Match`` compares strongly, a weak one never matches."""
    if value and not value.startswith("W/"):
        return value
    return None


def pin_headers(etag: str | None, last_modified: str | None) -> dict[str, str]:
    """The headers that make a request fail (``412``) once the file has changed."""
    if etag:
        return {"If-Match": etag}
    if last_modified:
        return {"If-Unmodified-Since": last_modified}
    return {}


def check_encoding(url: str, headers: Mapping[str, str]) -> None:
    """Refuse a body that is not the stored bytes themselves.

    Every request asks for ``Accept-Encoding: identity``; a server (or proxy) that
    compresses anyway would have its gzip bytes land in the tensor, so the answer
    is dropped, before any byte of it is kept, and the range tried again.

    Raises:
        RetryableError: the body is encoded.
    """
    encoding = (headers.get("Content-Encoding") or "").strip().lower()
    if encoding not in ("", "identity"):
        raise RetryableError(
            f"the server answered with Content-Encoding: {encoding} although only identity "
            f"was accepted, so the body is not {url}'s bytes; nothing of it was kept"
        )


def size_of(
    url: str, status: int, headers: Mapping[str, str], probe: int = PROBE_SIZE
) -> tuple[int, bool]:
    """The file size from the answer to the probe (of the first ``probe`` bytes), and
    whether the server honours Range (a file the probe reads whole needs no Range).

    Raises:
        SourceError: the answer does not give the size.
    """
    if status == 206:
        parsed = parse_content_range(headers.get("Content-Range", ""))
        if parsed is None or parsed.total is None:
            raise SourceError(f"{url}: the server's Content-Range does not give the file size")
        return parsed.total, True
    length = headers.get("Content-Length")
    if length is None:
        raise SourceError(
            f"{url}: the server neither honours Range nor sends Content-Length, so the file "
            "size is unknown; serve it from a regular file server"
        )
    size = int(length)
    return size, size <= probe


def check_url(asked: str, url: str) -> None:
    """Refuse a URL no request can go to (no host, a port outside 1-65535) before an
    HTTP client does, with the whole URL, signature and all, in its message.

    Args:
        asked: the URL the caller asked for.
        url: where the request goes (``asked``, a store's endpoint, a redirect target).

    Raises:
        ConfigError: ``url`` is the URL asked for.
        SourceError: ``url`` came from elsewhere (an endpoint setting, a redirect).
    """
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        problem = "its port is not a number from 1 to 65535"
    elif not parts.hostname:
        problem = "it names no host"
    else:
        return
    if url == asked:
        raise ConfigError(f"{url} cannot be requested: {problem}; check the URL")
    raise SourceError(
        f"{asked}: the request goes to {url}, which cannot be requested: {problem}; check "
        "the URL, the endpoint settings and where the server redirects"
    )


def check_small_read(url: str, size: int, offset: int, length: int) -> None:
    """Refuse, before allocating, a read into new memory larger than any header or index.

    Raises:
        SourceError: ``length`` is above ``MAX_SMALL_READ``.
    """
    if length > MAX_SMALL_READ:
        raise SourceError(
            f"{url}: reading bytes [{offset}, {offset + length}) would need {length} bytes "
            f"of memory at once, more than any safetensors header or index file "
            f"({MAX_SMALL_READ} bytes); the server says the file is {size} bytes: check "
            "that the URL names the right file and that the server reports its size right"
        )


def check_same_range(
    url: str, size: int, etag: str | None, status: int, headers: Mapping[str, str], start: int
) -> None:
    """Check that the answer to a range GET is the range asked for, of the pinned version.

    Raises:
        ObjectChangedError: Range is no longer honoured, another range came back,
            or the size or the ETag changed.
    """
    changed = None
    if status != 206:
        changed = "the server stopped honouring Range"
    else:
        parsed = parse_content_range(headers.get("Content-Range", ""))
        if parsed is None or parsed.start != start:
            changed = f"the server answered a different range ({headers.get('Content-Range')})"
        elif parsed.total is not None and parsed.total != size:
            changed = f"its size changed from {size} to {parsed.total} bytes"
        else:
            now = strong_etag(headers.get("ETag"))
            if etag and now and now != etag:
                changed = f"its ETag changed from {etag} to {now}"
    if changed:
        raise ObjectChangedError(
            f"{url} changed during the load: {changed}; tensors from two versions must "
            "not be mixed: load again"
        )


def check_same_etag(url: str, etag: str | None, headers: Mapping[str, str]) -> None:
    """Check the ETag of a whole-file answer (sequential reads) against the pinned one.

    Raises:
        ObjectChangedError: both are known and they differ.
    """
    now = strong_etag(headers.get("ETag"))
    if etag and now and now != etag:
        raise ObjectChangedError(
            f"{url} changed during the load: its ETag changed from {etag} to {now}; load again"
        )


def same_origin(url: str, other: str) -> bool:
    """Same scheme and host (and port): a redirect from https to http, or to another
    host, must not carry the configured headers."""
    return urlparse(url)[:2] == urlparse(other)[:2]


def redirect_target(asked: str, current: str, location: str) -> str:
    """The absolute URL a redirect from ``current`` to ``location`` points to.

    Raises:
        SourceError: it is not an http:// or https:// URL.
    """
    url = urljoin(current, location)
    scheme = urlparse(url).scheme
    if scheme not in ("http", "https"):
        raise SourceError(
            f"{asked}: the server redirected to {url}, a {scheme or 'relative'}: URL; "
            "only http:// and https:// redirects are followed: use the final URL"
        )
    return url


def too_many_redirects(asked: str, last: str) -> SourceError:
    """The error once ``MAX_REDIRECTS`` redirects did not reach the file."""
    return SourceError(
        f"{asked}: more than {MAX_REDIRECTS} redirects (last to {last}); use the final URL"
    )
