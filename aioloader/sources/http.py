"""HTTP(S): concurrent ``Range`` GETs through one shared aiohttp session.

Each byte range is one GET. A failed transfer (reset, short body, 5xx, stall) is
retried with exponential backoff and jitter, resuming from the last byte that
arrived; ``429`` / ``503`` also lower the requests in flight (see throttle.py).
The version seen when a file is opened is pinned: every later range carries
``If-Match`` with its ETag, so a file replaced mid-load fails the load instead
of mixing tensors from two versions. A server that ignores ``Range`` is detected
on open and read as one sequential stream, with a warning.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import re
import ssl
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urljoin, urlparse

from multidict import CIMultiDict

from ..config import HttpOptions
from ..errors import (
    AccessDeniedError,
    ClosedError,
    NotFoundError,
    ObjectChangedError,
    ReadError,
    ReadTimeoutError,
    SourceError,
)
from ..throttle import AdaptiveLimiter
from .base import Blob, Source
from .wire import Answer, Pace, RangeClient, WireError

__all__ = ["HttpBlob", "HttpSource"]

logger = logging.getLogger("aioloader")

# The first request to a file asks for this much: the size, the version and
# (nearly always) the whole safetensors header arrive in one round trip.
PROBE_SIZE = 256 * 1024
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_RETRY_STATUSES = {408, 425, 500, 502, 504}
_THROTTLE_STATUSES = {429, 503}
_REDIRECT_STATUSES = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 10


class _Retryable(Exception):
    """A failure worth another attempt (the transfer resumes where it stopped)."""

    def __init__(
        self, reason: str, *, throttled: bool = False, retry_after: float | None = None,
        timeout: bool = False, slow: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(reason)
        self.throttled = throttled
        self.retry_after = retry_after
        self.timeout = timeout
        self.slow = slow  # too slow to count as progress, whatever arrived


class _Filler:
    """Copies a stream of byte chunks into consecutive buffers: the only copy made."""

    def __init__(self, buffers: Sequence[memoryview]) -> None:
        self._buffers = [b.cast("B") if b.format != "B" else b for b in buffers]
        self._index = 0
        self._offset = 0
        self.total = sum(b.nbytes for b in self._buffers)
        self.written = 0

    @property
    def remaining(self) -> int:
        return self.total - self.written

    def current(self) -> memoryview:
        """The free part of the buffer being filled (for reads straight into it)."""
        return self._buffers[self._index][self._offset :]

    def advance(self, nbytes: int) -> None:
        """Count ``nbytes`` written into ``current()``."""
        self._offset += nbytes
        self.written += nbytes
        if self._offset == self._buffers[self._index].nbytes and self.written < self.total:
            self._index += 1
            self._offset = 0

    def write(self, chunk: bytes | memoryview) -> None:
        if len(chunk) > self.remaining:
            raise _Retryable(f"server sent {len(chunk) - self.remaining} bytes more than asked")
        view = memoryview(chunk)
        while view.nbytes:
            target = self._buffers[self._index]
            n = min(view.nbytes, target.nbytes - self._offset)
            target[self._offset : self._offset + n] = view[:n]
            view = view[n:]
            self._offset += n
            self.written += n
            if self._offset == target.nbytes:
                self._index += 1
                self._offset = 0


def _clip(buffers: Sequence[memoryview], limit: int) -> list[memoryview]:
    """The buffers cut to ``limit`` bytes: plans may reach past the end of a file."""
    out = []
    for buffer in buffers:
        if limit <= 0:
            break
        out.append(buffer[:limit])
        limit -= buffer.nbytes
    return out


def _retry_after(value: str | None) -> float | None:
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
    return max(0.0, when.timestamp() - time.time())


def _check_encoding(url: str, headers: Any) -> None:
    """Refuse a body that is not the stored bytes themselves.

    Every request asks for ``Accept-Encoding: identity``; a server (or proxy) that
    compresses anyway would have its gzip bytes land in the tensor, so the answer
    is dropped, before any byte of it is kept, and the range tried again.
    """
    encoding = (headers.get("Content-Encoding") or "").strip().lower()
    if encoding not in ("", "identity"):
        raise _Retryable(
            f"the server answered with Content-Encoding: {encoding} although only identity "
            f"was accepted, so the body is not {url}'s bytes; nothing of it was kept"
        )


def _strong_etag(value: str | None) -> str | None:
    # If-Match compares strongly: a weak validator can never match.
    if value and not value.startswith("W/"):
        return value
    return None


class HttpBlob(Blob):
    """One remote file, pinned to the version seen when it was opened."""

    def __init__(
        self,
        source: HttpSource,
        url: str,
        fetch_url: str,
        size: int,
        etag: str | None,
        last_modified: str | None,
        head: bytes,
        ranged: bool,
    ) -> None:
        self.url = url
        self.fetch_url = fetch_url
        self.size = size
        self.etag = etag
        self.last_modified = last_modified
        self._source = source
        self._head = head
        self._ranged = ranged
        self._closed = False
        # Sequential mode (server ignores Range): one open response and its position.
        self._stream_lock = asyncio.Lock()
        self._stream: Any = None
        self._stream_pos = 0

    def __repr__(self) -> str:
        return f"<HttpBlob {self.url!r} size={self.size} etag={self.etag} ranged={self._ranged}>"

    def pin_headers(self) -> dict[str, str]:
        if self.etag:
            return {"If-Match": self.etag}
        if self.last_modified:
            return {"If-Unmodified-Since": self.last_modified}
        return {}

    async def read_bytes(self, offset: int, length: int) -> bytes:
        if offset + length <= len(self._head):
            return self._head[offset : offset + length]
        buffer = bytearray(length)
        await self.read_into(offset, [memoryview(buffer)])
        return bytes(buffer)

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        if self._closed:
            raise ClosedError(f"{self.url} was already closed")
        filler = _Filler(_clip(buffers, self.size - offset))
        if filler.total == 0:
            return
        end = offset + filler.total
        if end <= len(self._head):
            filler.write(self._head[offset:end])
            return

        def progress() -> int:
            return filler.written

        if self._ranged:
            await self._source._retrying(
                self.url,
                offset,
                end,
                lambda: self._source._fetch_range(self, offset, filler),
                progress,
            )
        else:
            async with self._stream_lock:
                await self._source._retrying(
                    self.url, offset, end, lambda: self._read_sequential(offset, filler), progress
                )

    async def _read_sequential(self, offset: int, filler: _Filler) -> None:
        position = offset + filler.written
        try:
            if self._stream is None or self._stream_pos > position:
                await self._close_stream()
                self._stream = await self._source._open_stream(self)
                self._stream_pos = 0
            content = self._stream.content
            pace = self._source._pace(self._stream_pos)
            while self._stream_pos < position:
                skipped = await content.read(min(position - self._stream_pos, 1 << 20))
                if not skipped:
                    raise _Retryable(f"stream ended at byte {self._stream_pos}")
                self._stream_pos += len(skipped)
                _keep_pace(pace, self._stream_pos)
            while filler.remaining:
                chunk = await content.read(min(filler.remaining, 1 << 20))
                if not chunk:
                    raise _Retryable(f"stream ended at byte {self._stream_pos}")
                filler.write(chunk)
                self._stream_pos += len(chunk)
                _keep_pace(pace, self._stream_pos)
        except _Retryable:
            await self._close_stream()
            raise
        except self._source._transport_errors() as exc:
            await self._close_stream()
            raise _Retryable(str(exc) or type(exc).__name__, timeout=_is_timeout(exc)) from exc

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    async def aclose(self) -> None:
        self._closed = True
        await self._close_stream()


class _WireResponse:
    """A direct-client answer, shaped like the parts of an aiohttp response we read."""

    def __init__(self, answer: Answer) -> None:
        self.status = answer.status
        self.reason = answer.reason
        self.headers = CIMultiDict(answer.headers)
        self.content = self
        self._body = answer.body

    async def read(self, n: int = -1) -> bytes:
        return self._body if n < 0 else self._body[:n]


def _keep_pace(pace: Pace, done: int) -> None:
    slow = pace.too_slow(done)
    if slow is not None:
        raise _Retryable(slow, timeout=True, slow=True)


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError)


class HttpSource(Source):
    """Files served over HTTP(S).

    Args:
        concurrency: the most requests in flight.
        options: retries, timeouts and extra headers.
    """

    scheme_name = "HTTP"

    def __init__(self, concurrency: int, options: HttpOptions | None = None) -> None:
        self._concurrency = concurrency
        self._options = options or HttpOptions()
        self._limiter = AdaptiveLimiter(concurrency)
        self._session: Any = None
        self._wire: RangeClient | None = None
        self._closed = False
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._limiter!r}>"

    def statistics(self) -> Any:
        return self._limiter.statistics()

    # -- pieces a subclass (S3) replaces -------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | None:
        return None

    async def _prepare(
        self, blob_url: str, fetch_url: str, headers: dict[str, str], method: str = "GET"
    ) -> dict[str, str]:
        """Headers for one request; the base adds the configured extra headers."""
        # Same scheme too: a redirect from https to http must not carry a token in clear.
        if urlparse(fetch_url)[:2] == urlparse(blob_url)[:2]:
            headers = {**dict(self._options.headers), **headers}
        return headers

    def _follow_redirects(self) -> bool:
        return True

    def _target(self, fetch_url: str) -> Any:
        """What aiohttp is asked to fetch (a subclass may pass a pre-encoded URL)."""
        return fetch_url

    def _fetch_url(self, url: str) -> str:
        return url

    def _describe_denied(self, url: str, status: int, detail: str) -> str:
        given = "with the configured headers" if self._options.headers else "without credentials"
        return (
            f"{url}: HTTP {status} {detail}; the request was sent {given}. Check the token "
            "(e.g. headers={'Authorization': 'Bearer ...'}) and that it may read this file"
        )

    # -- the shared session ------------------------------------------------------

    def _transport_errors(self) -> tuple[type[BaseException], ...]:
        import aiohttp

        return (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError)

    async def _client(self) -> Any:
        if self._closed:
            raise ClosedError(f"this {type(self).__name__} is closed")
        if self._session is None:
            import aiohttp

            # No pool limit: the limiter bounds the requests in flight. A pool limit on
            # top would count the parked stream of each file read sequentially (server
            # ignoring Range), and once those fill the pool every other request waits
            # for a connection forever.
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=0, ssl=self._ssl_context() or True, ttl_dns_cache=300
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,  # ranges address the stored bytes
                trust_env=True,  # HTTP(S)_PROXY, NO_PROXY
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self._options.connect_timeout,
                    sock_read=self._options.stall_timeout,
                ),
            )
        return self._session

    async def _request(self, blob_url: str, fetch_url: str, headers: dict[str, str]) -> Any:
        session = await self._client()
        headers = {"Accept-Encoding": "identity", **headers}
        policy = self._options.url_policy
        if policy is not None:
            policy(blob_url)
        url = fetch_url
        # Redirects are followed here, not by aiohttp: it forwards every header but
        # Authorization to the next host, and the configured headers (API keys and
        # the like) must only ever reach the URL's own host.
        for _ in range(_MAX_REDIRECTS + 1):
            prepared = await self._prepare(blob_url, url, headers)
            response = await session.get(self._target(url), headers=prepared, allow_redirects=False)
            location = response.headers.get("Location")
            if (
                response.status not in _REDIRECT_STATUSES
                or location is None
                or not self._follow_redirects()
            ):
                return response
            response.release()
            url = urljoin(str(response.url), location)
            scheme = urlparse(url).scheme
            if scheme not in ("http", "https"):
                raise SourceError(
                    f"{blob_url}: the server redirected to {url}, a {scheme or 'relative'}: URL; "
                    "only http:// and https:// redirects are followed: use the final URL"
                )
            if policy is not None:
                policy(url)
        raise SourceError(
            f"{blob_url}: more than {_MAX_REDIRECTS} redirects (last to {url}); use the final URL"
        )

    # -- retries ---------------------------------------------------------------------

    def _pace(self, done: int = 0) -> Pace:
        return Pace(self._options.min_speed, self._options.speed_window, done)

    async def _retrying(
        self,
        url: str,
        start: int,
        end: int,
        attempt_once: Callable[[], Any],
        progress: Callable[[], int] | None = None,
    ) -> Any:
        """Run ``attempt_once`` until it succeeds or attempts run out.

        Only attempts that make no progress use up ``max_attempts``: a link that
        drops every connection but delivers bytes each time (``progress`` grows)
        still finishes. An attempt that ended in a stall or was dropped for being too
        slow counts, however many bytes it brought, so a trickle cannot retry forever.
        """
        options = self._options
        try:
            async with asyncio.timeout(options.deadline):
                return await self._attempts(url, start, end, attempt_once, progress)
        except TimeoutError as exc:
            if isinstance(exc, ReadTimeoutError):
                raise
            raise ReadTimeoutError(
                f"{url} bytes [{start}, {end}) did not arrive within the deadline of "
                f"{options.deadline:g} s (HttpOptions.deadline); raise it, or check the "
                "server's speed",
                url=url, start=start, end=end,
            ) from None  # fmt: skip

    async def _attempts(
        self,
        url: str,
        start: int,
        end: int,
        attempt_once: Callable[[], Any],
        progress: Callable[[], int] | None,
    ) -> Any:
        options = self._options
        failures: list[str] = []
        wasted = 0  # attempts that brought nothing
        timed_out = False
        while True:
            before = progress() if progress is not None else 0
            ticket = await self._limiter.acquire()
            try:
                result = await attempt_once()
            except _Retryable as exc:
                failures.append(str(exc))
                timed_out = exc.timeout
                if exc.throttled:
                    # The pause holds back every request, so it is capped like one delay:
                    # a huge Retry-After must not stall the load beyond backoff_max.
                    pause = min(exc.retry_after or options.backoff, options.backoff_max)
                    self._limiter.on_throttle(pause, ticket)
                retry_after = exc.retry_after
                # A stall or a trickle is no progress, whatever bytes came before it.
                moved = progress is not None and progress() > before and not exc.timeout
            else:
                self._limiter.on_success()
                return result
            finally:
                self._limiter.release()
            if not moved:
                wasted += 1
                if wasted == options.max_attempts:
                    break
            ceiling = min(options.backoff_max, options.backoff * (2 ** max(0, wasted - 1)))
            delay = random.uniform(ceiling / 2, ceiling) if not moved else 0.0
            if retry_after is not None:
                delay = max(delay, min(retry_after, options.backoff_max))
            logger.info(
                "retrying %s bytes [%d, %d) in %.2f s (%d of %d attempts without progress): %s",
                url, start, end, delay, wasted, options.max_attempts, failures[-1],
            )  # fmt: skip
            await asyncio.sleep(delay)
        error = ReadTimeoutError if timed_out else ReadError
        raise error(
            f"{url} bytes [{start}, {end}) failed after {len(failures)} attempts, "
            f"{wasted} of them without progress (last: {failures[-1]}); check that the server "
            "is reachable and healthy, or raise HttpOptions.max_attempts / stall_timeout",
            url=url, start=start, end=end,
        )  # fmt: skip

    async def _error_detail(self, response: Any) -> str:
        """A short description of an error response, for messages."""
        return f"{response.reason or ''}".strip()

    async def _check_status(self, url: str, response: Any, pinned: str | None) -> None:
        status = response.status
        if status in (200, 206):
            return
        if status in _THROTTLE_STATUSES:
            raise _Retryable(
                f"HTTP {status} (server is throttling)", throttled=True,
                retry_after=_retry_after(response.headers.get("Retry-After")),
            )  # fmt: skip
        if status in _RETRY_STATUSES or 500 <= status < 600:
            raise _Retryable(f"HTTP {status}")
        if status == 412:
            raise ObjectChangedError(
                f"{url} changed on the server after the load started (version {pinned} is gone); "
                "tensors from two versions must not be mixed: load again"
            )
        detail = await self._error_detail(response)
        if status in (401, 403):
            raise AccessDeniedError(self._describe_denied(url, status, detail))
        if status == 404:
            raise NotFoundError(f"{url} does not exist (HTTP 404 {detail}); check the URL")
        if 300 <= status < 400:
            raise SourceError(
                f"{url}: HTTP {status} {detail} redirect to {response.headers.get('Location')} "
                "was not followed; use the final URL"
            )
        raise SourceError(f"{url}: unexpected HTTP {status} {detail}")

    # -- Source ----------------------------------------------------------------------

    async def list_dir(self, url: str) -> list[str] | None:
        if url.endswith("/"):
            raise SourceError(
                f"{url}: an HTTP server cannot be asked for a folder listing; pass the URL of "
                "model.safetensors.index.json, of a .safetensors file, or a list of shard URLs"
            )
        return None

    async def open(self, url: str) -> Blob:
        fetch_url = self._fetch_url(url)
        return await self._retrying(  # type: ignore[no-any-return]
            url, 0, PROBE_SIZE, lambda: self._probe(url, fetch_url)
        )

    async def _probe(self, url: str, fetch_url: str) -> HttpBlob:
        headers = {"Range": f"bytes=0-{PROBE_SIZE - 1}"}
        try:
            response = await self._request(url, fetch_url, headers)
            async with response:
                if response.status == 416:
                    return HttpBlob(self, url, fetch_url, 0, None, None, b"", True)
                await self._check_status(url, response, None)
                _check_encoding(url, response.headers)
                size, ranged = self._size_of(url, response)
                expected = min(size, PROBE_SIZE)
                head = await response.content.read(expected) if expected else b""
                while len(head) < expected:
                    more = await response.content.read(expected - len(head))
                    if not more:
                        raise _Retryable(f"body ended after {len(head)} of {expected} bytes")
                    head += more
                final = str(response.url)
                etag = _strong_etag(response.headers.get("ETag"))
                modified = response.headers.get("Last-Modified")
        except self._transport_errors() as exc:
            raise _Retryable(str(exc) or type(exc).__name__, timeout=_is_timeout(exc)) from exc
        if not ranged:
            self._warn_once(
                urlparse(url).netloc,
                f"{url}: the server ignores Range requests, so this file is read as one "
                "sequential stream (no parallel reads); serve it from a server that supports "
                "Range for full speed",
            )
        return HttpBlob(self, url, final, size, etag, modified, head, ranged)

    def _size_of(self, url: str, response: Any) -> tuple[int, bool]:
        if response.status == 206:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if not match or match.group(3) == "*":
                raise SourceError(f"{url}: the server's Content-Range does not give the file size")
            return int(match.group(3)), True
        length = response.headers.get("Content-Length")
        if length is None:
            raise SourceError(
                f"{url}: the server neither honours Range nor sends Content-Length, so the file "
                "size is unknown; serve it from a regular file server"
            )
        size = int(length)
        return size, size <= PROBE_SIZE

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message)

    async def _fetch_range(self, blob: HttpBlob, offset: int, filler: _Filler) -> None:
        start = offset + filler.written
        last = offset + filler.total - 1
        headers = {"Range": f"bytes={start}-{last}", **blob.pin_headers()}
        if await self._fetch_range_direct(blob, start, filler, headers):
            return
        try:
            response = await self._request(blob.url, blob.fetch_url, headers)
            async with response:
                await self._check_status(blob.url, response, blob.etag)
                _check_encoding(blob.url, response.headers)
                self._check_same_version(blob, response, start)
                pace = self._pace(filler.written)
                while filler.remaining:
                    chunk = await response.content.readany()
                    if not chunk:
                        raise _Retryable(
                            f"body ended after {filler.written} of {filler.total} bytes"
                        )
                    filler.write(chunk)
                    _keep_pace(pace, filler.written)
        except self._transport_errors() as exc:
            raise _Retryable(str(exc) or type(exc).__name__, timeout=_is_timeout(exc)) from exc

    async def _fetch_range_direct(
        self, blob: HttpBlob, start: int, filler: _Filler, headers: dict[str, str]
    ) -> bool:
        """The hot path: the body goes from the socket straight into ``filler``.

        Returns False when the answer is not a plain ``206`` for this version (an
        error, a redirect, ...): the caller then asks again through aiohttp.
        """
        url = self._wire_url(blob.fetch_url)
        if url is None:
            return False
        if self._wire is None:
            options = self._options
            self._wire = RangeClient(
                self._ssl_context(),
                options.connect_timeout,
                options.stall_timeout,
                options.min_speed,
                options.speed_window,
            )
        prepared = await self._prepare(
            blob.url, blob.fetch_url, {"Accept-Encoding": "identity", **headers}
        )

        def accept(answer: Answer) -> bool:
            if answer.status != 206:
                return False
            response = _WireResponse(answer)
            _check_encoding(blob.url, response.headers)
            self._check_same_version(blob, response, start)
            return True

        try:
            refused = await self._wire.get_into(
                url, prepared, filler.remaining, filler.current, filler.advance, accept
            )
        except WireError as exc:
            raise _Retryable(str(exc), timeout=exc.timeout, slow=exc.slow) from exc
        if refused is None:
            return True
        if refused.status in _REDIRECT_STATUSES:
            return False  # aiohttp follows redirects, with our header rules
        response = _WireResponse(refused)
        await self._check_status(blob.url, response, blob.etag)
        self._check_same_version(blob, response, start)
        return False

    def _wire_url(self, fetch_url: str) -> str | None:
        """The URL for the direct client, or None where only aiohttp will do (proxies)."""
        from yarl import URL

        target = self._target(fetch_url)
        url = target if isinstance(target, URL) else URL(target)
        if url.scheme not in ("http", "https") or url.host is None:
            return None
        proxies = urllib.request.getproxies()
        if url.scheme in proxies and not urllib.request.proxy_bypass(url.host):
            return None
        return str(url)

    def _check_same_version(self, blob: HttpBlob, response: Any, start: int) -> None:
        changed = None
        if response.status != 206:
            changed = "the server stopped honouring Range"
        else:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != start:
                answered = response.headers.get("Content-Range")
                changed = f"the server answered a different range ({answered})"
            elif match.group(3) != "*" and int(match.group(3)) != blob.size:
                changed = f"its size changed from {blob.size} to {match.group(3)} bytes"
            else:
                etag = _strong_etag(response.headers.get("ETag"))
                if blob.etag and etag and etag != blob.etag:
                    changed = f"its ETag changed from {blob.etag} to {etag}"
        if changed:
            raise ObjectChangedError(
                f"{blob.url} changed during the load: {changed}; tensors from two versions must "
                "not be mixed: load again"
            )

    async def _open_stream(self, blob: HttpBlob) -> Any:
        response = await self._request(blob.url, blob.fetch_url, blob.pin_headers())
        try:
            await self._check_status(blob.url, response, blob.etag)
            _check_encoding(blob.url, response.headers)
            etag = _strong_etag(response.headers.get("ETag"))
            if blob.etag and etag and etag != blob.etag:
                raise ObjectChangedError(
                    f"{blob.url} changed during the load: its ETag changed from {blob.etag} to "
                    f"{etag}; load again"
                )
        except BaseException:
            response.close()
            raise
        return response

    def join(self, base: str, name: str) -> str:
        return urljoin(base if base.endswith("/") else base + "/", name)

    def parent(self, url: str) -> str:
        return url.rsplit("/", 1)[0]

    async def aclose(self) -> None:
        self._closed = True
        if self._wire is not None:
            self._wire.close()
            self._wire = None
        session, self._session = self._session, None
        if session is not None:
            await session.close()
