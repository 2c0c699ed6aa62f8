"""One remote store reached over HTTP: its transport, its retries, and opening files.

Opening a file is one probe: a range GET of its first ``PROBE_SIZE`` bytes gives
its size, its version and (nearly always) the whole safetensors header in one
round trip (its first byte only, inside ``opening.lean()``). A server that ignores
``Range`` is detected there, and the file is read as one sequential stream, with a
warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from ...errors import NotFoundError
from ...redact import redacting_logger
from ...runtime.pace import take
from ...runtime.threads import Lanes
from ...runtime.throttle import LimiterStatistics
from ...settings.values import HttpOptions
from ..opening import probe_size
from .blob import HttpBlob
from .retry import Retrier, RetryableError
from .rules import check_encoding, size_of, strong_etag
from .signer import Signer
from .transport import HttpTransport, retryable, transport_errors

__all__ = ["HttpStore"]

logger = redacting_logger(__name__)


class HttpStore:
    """The HTTP machinery a remote source holds: signed requests, retried and throttled.

    Args:
        owner: the name of the source, for messages.
        lanes: the owner's threads (blobs fault in their buffers in ``compute``);
            ``lanes.concurrency`` requests in flight at most.
        options: retries, timeouts and the URL policy.
        signer: authorises the requests (plain headers, AWS SigV4, ...).
    """

    def __init__(self, owner: str, lanes: Lanes, options: HttpOptions, signer: Signer) -> None:
        self.transport = HttpTransport(owner, options, signer)
        self.retrier = Retrier(lanes.concurrency, options)
        self.lanes = lanes
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return repr(self.retrier)

    def statistics(self) -> LimiterStatistics:
        return self.retrier.statistics()

    async def open(self, url: str, fetch_url: str) -> HttpBlob:
        """Open the file ``url``, found at ``fetch_url``, pinned to its current version.

        Raises:
            ReadError: every attempt failed.
            SourceError: the file cannot be read (missing, denied, size unknown, ...).
        """
        probe = probe_size()
        return await self.retrier.run(url, 0, probe, lambda: self._probe(url, fetch_url, probe))

    async def _probe(self, url: str, fetch_url: str, probe: int) -> HttpBlob:
        transport = self.transport
        headers = {"Range": f"bytes=0-{probe - 1}"}
        await take(probe)  # a paced fetch's probes count too (pace.py)
        try:
            response = await transport.get(url, fetch_url, headers)
            async with response:
                if response.status == 416:
                    lane = self.lanes.compute
                    return HttpBlob(
                        transport, self.retrier, url, fetch_url, 0, None, None, b"", True, lane
                    )
                await transport.check_status(url, response, None)
                check_encoding(url, response.headers)
                size, ranged = size_of(url, response.status, response.headers, probe)
                expected = min(size, probe)
                head = await response.content.read(expected) if expected else b""
                while len(head) < expected:
                    more = await response.content.read(expected - len(head))
                    if not more:
                        raise RetryableError(f"body ended after {len(head)} of {expected} bytes")
                    head += more
                final = str(response.url)
                etag = strong_etag(response.headers.get("ETag"))
                modified = response.headers.get("Last-Modified")
        except transport_errors() as exc:
            raise retryable(exc) from exc
        if not ranged:
            self._warn_once(
                urlparse(url).netloc,
                f"{url}: the server ignores Range requests, so this file is read as one "
                "sequential stream (no parallel reads); serve it from a server that supports "
                "Range for full speed",
            )
        lane = self.lanes.compute
        return HttpBlob(
            transport, self.retrier, url, final, size, etag, modified, head, ranged, lane
        )

    async def head(self, url: str, fetch_url: str) -> tuple[int, str | None, str | None] | None:
        """(size, strong ETag, Last-Modified) of ``url`` from a HEAD: no body crosses the
        network. None where the answer cannot tell (no HEAD, no Content-Length, an
        encoded body): the caller opens the file instead.

        Raises:
            ReadError: every attempt failed.
            SourceError: the file cannot be read (missing, denied, ...).
        """
        return await self.retrier.run(url, 0, 0, lambda: self._head_once(url, fetch_url))

    async def _head_once(
        self, url: str, fetch_url: str
    ) -> tuple[int, str | None, str | None] | None:
        transport = self.transport
        try:
            headers = {"Accept-Encoding": "identity"}
            async with await transport.send("HEAD", url, fetch_url, headers) as response:
                await take(_header_bytes(response))  # a HEAD brings its headers only
                if response.status in (405, 501) or 300 <= response.status < 400:
                    return None  # no HEAD here, or a redirect that GET would follow
                await transport.check_status(url, response, None)
                answer = response.headers
                length = answer.get("Content-Length", "")
                encoded = answer.get("Content-Encoding", "identity").lower() != "identity"
                if response.status != 200 or encoded or not length.isdigit():
                    return None
                etag = strong_etag(answer.get("ETag"))
                return int(length), etag, answer.get("Last-Modified")
        except transport_errors() as exc:
            raise retryable(exc) from exc

    async def read_body(self, url: str, fetch_url: str, not_found: Callable[[str], str]) -> bytes:
        """GET ``fetch_url`` whole (a listing page, an object's metadata), retried.

        Raises:
            NotFoundError: a 404, with the message ``not_found(the store's explanation)``.
        """
        return await self.retrier.run(url, 0, 0, lambda: self._body_once(url, fetch_url, not_found))

    async def _body_once(self, url: str, fetch_url: str, not_found: Callable[[str], str]) -> bytes:
        transport = self.transport
        try:
            response = await transport.get(url, fetch_url, {})
            async with response:
                if response.status == 404:
                    raise NotFoundError(not_found(await transport.signer.error_detail(response)))
                await transport.check_status(url, response, None)
                # A listing page or metadata is bytes from the origin as a file's are: a
                # paced fetch takes them (pace.py), before the body when its length is
                # known, else once it has come.
                length = response.content_length
                await take(length or 0)
                body: bytes = await response.read()
                if length is None:
                    await take(len(body))
                return body
        except transport_errors() as exc:
            raise RetryableError(str(exc) or type(exc).__name__) from exc

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message)

    async def aclose(self) -> None:
        """Close the connections; idempotent."""
        await self.transport.aclose()


def _header_bytes(response: Any) -> int:
    """About the bytes of an answer's status line and headers, as they came."""
    return 16 + sum(len(name) + len(value) + 4 for name, value in response.raw_headers)
