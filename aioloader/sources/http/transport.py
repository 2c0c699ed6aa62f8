"""One remote store's HTTP transport: an aiohttp session plus the direct range client.

Requests go out signed by the store's Signer (signer.py). Range bodies take the
direct client (client.py), which puts them straight into the caller's buffers, on
the caller's loop or on receive lanes (lanes.py, ``HttpOptions.receive_lanes``);
everything else, and any answer the direct client will not take (errors,
redirects, proxies), goes through aiohttp. Redirects are followed here, not by
aiohttp, so that the configured headers only ever reach the URL's own origin and
``HttpOptions.url_policy`` sees every target.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlparse

from multidict import CIMultiDict

from ...errors import ClosedError, SourceError
from ...settings.values import HttpOptions
from .auto_lanes import receiver
from .client import Answer, WireError
from .lanes import Receiver
from .retry import RetryableError
from .rules import (
    MAX_REDIRECTS,
    REDIRECT_STATUSES,
    check_encoding,
    check_url,
    failure,
    redirect_target,
    status_error,
    too_many_redirects,
)
from .signer import Signer

__all__ = [
    "HttpTransport",
    "Sink",
    "WireResponse",
    "retryable",
    "transport_errors",
    "unresolvable",
]

_IDENTITY = {"Accept-Encoding": "identity"}

# getaddrinfo's answers that are final: the name does not exist (or has no address, or
# the resolver refuses for good). EAI_AGAIN, "try again later", stays transient.
_NO_SUCH_HOST = frozenset(
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_FAIL")
    if hasattr(socket, name)
)


class Sink(Protocol):
    """Where a range body goes: consecutive free memory, filled in place."""

    @property
    def remaining(self) -> int: ...

    def current(self) -> memoryview: ...

    def advance(self, nbytes: int) -> None: ...


class WireResponse:
    """A direct-client answer, shaped like the parts of an aiohttp response we read."""

    def __init__(self, answer: Answer) -> None:
        self.status = answer.status
        self.reason = answer.reason
        self.headers = CIMultiDict(answer.headers)
        self.content = self
        self._body = answer.body

    async def read(self, n: int = -1) -> bytes:
        return self._body if n < 0 else self._body[:n]


def transport_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a request that failed in transit (worth another attempt).

    aiohttp raises a ClientResponseError (status 400, no response) when its parser
    refuses an answer: both Transfer-Encoding and Content-Length, a list of lengths.
    """
    import aiohttp

    return (
        aiohttp.ClientPayloadError,
        aiohttp.ClientConnectionError,
        aiohttp.ClientResponseError,
        TimeoutError,
    )


def unresolvable(url: str, exc: BaseException) -> SourceError | None:
    """The error for a request whose host name does not resolve, or None when ``exc``
    is no such failure (or a transient one, worth retrying like any other).

    A name that does not exist will not exist on the next attempt either: failing at
    once, naming the host, beats six attempts that end in a message hiding the cause.
    """
    error = getattr(exc, "os_error", exc)
    if not isinstance(error, socket.gaierror) or error.errno not in _NO_SUCH_HOST:
        return None
    host = urlparse(url).hostname or url
    return SourceError(
        f"{url}: the host name {host!r} does not resolve ({error.strerror or error}); check "
        "the URL's host for typos, and this machine's DNS (or HTTP(S)_PROXY) settings"
    )


def retryable(exc: BaseException) -> RetryableError:
    """A transport error as a RetryableError (a timeout counts as a stall)."""
    return RetryableError(str(exc) or type(exc).__name__, timeout=isinstance(exc, TimeoutError))


class HttpTransport:
    """Signed requests to one kind of remote store, over shared connections.

    Args:
        owner: the name of the source it serves, for messages.
        options: timeouts and the URL policy.
        signer: authorises requests and explains refusals.
    """

    def __init__(self, owner: str, options: HttpOptions, signer: Signer) -> None:
        self._owner = owner
        self._options = options
        self.signer = signer
        self._session: Any = None
        self._wire: Receiver | None = None  # made on first use
        self._direct: dict[tuple[str, str], bool] = {}  # (scheme, host): no proxy between
        self._closed = False

    async def _client(self) -> Any:
        if self._closed:
            raise ClosedError(f"this {self._owner} is closed")
        if self._session is None:
            import aiohttp

            context = await self.signer.ssl_context()
            # No pool limit: the limiter bounds the requests in flight. A pool limit on
            # top would count the parked stream of each file read sequentially (server
            # ignoring Range), and once those fill the pool every other request waits
            # for a connection forever.
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=0, ssl=context or True, ttl_dns_cache=300
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

    def _target(self, url: str) -> Any:
        """What aiohttp is asked to fetch."""
        if self.signer.encoded_urls:
            from yarl import URL

            # Percent-encoded exactly as signed: aiohttp must not re-encode it.
            return URL(url, encoded=True)
        return url

    async def send(self, method: str, origin: str, url: str, headers: dict[str, str]) -> Any:
        """One signed request, redirects not followed; the caller closes the response.

        Args:
            origin: the URL the caller asked for (see Signer.sign).
        """
        check_url(origin, url)
        session = await self._client()
        signed = await self.signer.sign(method, url, headers, origin=origin)
        try:
            return await session.request(
                method, self._target(url), headers=signed, allow_redirects=False
            )
        except OSError as exc:  # aiohttp's connection errors are OSErrors
            error = unresolvable(url, exc)
            if error is not None:
                raise error from exc
            raise

    async def get(self, origin: str, url: str, headers: dict[str, str]) -> Any:
        """GET ``url`` for ``origin``, following the redirects the signer allows.

        The body is asked for unencoded, and every URL the request goes to is put to
        ``HttpOptions.url_policy`` first. The caller closes the response.

        Raises:
            SourceError: a redirect to a non-HTTP URL, or too many redirects.
        """
        await self._client()
        headers = {**_IDENTITY, **headers}
        policy = self._options.url_policy
        if policy is not None:
            policy(origin)
        for _ in range(MAX_REDIRECTS + 1):
            response = await self.send("GET", origin, url, headers)
            location = response.headers.get("Location")
            if (
                response.status not in REDIRECT_STATUSES
                or location is None
                or not self.signer.follow_redirects
            ):
                return response
            response.release()
            url = redirect_target(origin, str(response.url), location)
            if policy is not None:
                policy(url)
        raise too_many_redirects(origin, url)

    async def check_status(self, url: str, response: Any, pinned: str | None) -> None:
        """Raise the error a response's status calls for (nothing for 200 / 206).

        Raises:
            RetryableError: throttling or a transient failure.
            ObjectChangedError: the pinned version is gone (412).
            SourceError: any other failure, with what the body says about it.
        """
        error = status_error(url, response.status, response.headers, pinned)
        if error is not None:
            raise error
        if response.status in (200, 206):
            return
        detail = await self.signer.error_detail(response)
        location = response.headers.get("Location")
        raise failure(url, response.status, detail, location, self.signer.describe_denied)

    async def get_into(
        self,
        origin: str,
        url: str,
        headers: dict[str, str],
        sink: Sink,
        pinned: str | None,
        check_version: Callable[[int, Mapping[str, str]], None],
    ) -> bool:
        """The hot path: a ``206`` body goes from the socket straight into ``sink``.

        Args:
            pinned: the ETag the file was opened with.
            check_version: raises when a ``206`` answer is not of the pinned version.

        Returns:
            False when the direct client cannot or will not take the answer (a
            proxy, an error, a redirect, ...): the caller then asks through ``get``.
        """
        check_url(origin, url)
        wire_url = self._wire_url(url)
        if wire_url is None:
            return False
        if self._wire is None:
            context = await self.signer.ssl_context()
            if self._closed:
                raise ClosedError(f"this {self._owner} is closed")
            if self._wire is None:  # a concurrent first request may have made it meanwhile
                self._wire = receiver(context, self._options)
        wire = self._wire
        signed = await self.signer.sign("GET", url, {**_IDENTITY, **headers}, origin=origin)

        def accept(answer: Answer) -> bool:
            if answer.status != 206:
                return False
            response = WireResponse(answer)
            check_encoding(origin, response.headers)
            check_version(response.status, response.headers)
            return True

        try:
            refused = await wire.get_into(
                wire_url, signed, sink.remaining, sink.current, sink.advance, accept
            )
        except WireError as exc:
            raise RetryableError(str(exc), timeout=exc.timeout, slow=exc.slow) from exc
        if refused is None:
            return True
        if refused.status in REDIRECT_STATUSES:
            return False  # aiohttp follows redirects, with our header rules
        response = WireResponse(refused)
        await self.check_status(origin, response, pinned)
        check_version(response.status, response.headers)
        return False

    def _wire_url(self, url: str) -> str | None:
        """The URL for the direct client, or None where only aiohttp will do (proxies)."""
        from yarl import URL

        target = URL(url, encoded=self.signer.encoded_urls)
        if target.scheme not in ("http", "https") or target.host is None:
            return None
        key = (target.scheme, target.host)
        direct = self._direct.get(key)
        if direct is None:
            # Once per host: reading the proxy settings walks the whole environment,
            # milliseconds in a pod with thousands of variables, and a load makes
            # hundreds of range GETs.
            proxies = urllib.request.getproxies()
            proxied = target.scheme in proxies and not urllib.request.proxy_bypass(target.host)
            direct = self._direct[key] = not proxied
        return str(target) if direct else None

    async def aclose(self) -> None:
        """Close every connection; idempotent. Later requests raise ClosedError."""
        self._closed = True
        wire, self._wire = self._wire, None
        if wire is not None:
            await wire.aclose()
        session, self._session = self._session, None
        if session is not None:
            await session.close()
