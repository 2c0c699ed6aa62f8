"""What a remote source adds to the HTTP transport: its credentials and its words.

The transport (transport.py) speaks HTTP; a Signer says how requests to one kind
of storage are authorised (extra headers for plain HTTP, AWS Signature V4 for
S3, ...) and how that storage explains a refusal. A new store (GCS, Azure) is a
new Signer held by the same transport, not a subclass of it.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

from .rules import same_origin

__all__ = ["HeaderSigner", "Signer", "reason_of"]


class Signer(Protocol):
    """How requests to one kind of storage are authorised and explained.

    Attributes:
        follow_redirects: whether the transport follows redirects (a signature
            made for one host is worthless on another, so S3 does not).
        encoded_urls: the URLs it signs are percent-encoded exactly as signed and
            must be sent unchanged.
    """

    follow_redirects: bool
    encoded_urls: bool

    async def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings for the connections (``None``: the default trust store)."""

    async def sign(
        self, method: str, url: str, headers: dict[str, str], *, origin: str
    ) -> dict[str, str]:
        """The headers to send ``method url`` with.

        Args:
            headers: those the request needs (Range, If-Match, ...).
            origin: the URL the caller asked for; ``url`` may be a redirect target
                or the file's final location, where secrets may not belong.
        """

    async def error_detail(self, response: Any) -> str:
        """A short description of an error response (its body may say more), for messages."""

    def describe_denied(self, url: str, status: int, detail: str) -> str:
        """The message for ``401`` / ``403``: what was sent, and what to check."""


def reason_of(response: Any) -> str:
    """An answer's reason phrase: the detail of an error whose body says nothing more."""
    return f"{response.reason or ''}".strip()


class HeaderSigner:
    """Plain HTTP: the configured extra headers, only ever sent to the URL's own origin.

    Args:
        headers: e.g. ``(("Authorization", "Bearer ..."),)``.
    """

    follow_redirects = True
    encoded_urls = False

    def __init__(self, headers: tuple[tuple[str, str], ...]) -> None:
        self._headers = dict(headers)

    async def ssl_context(self) -> ssl.SSLContext | None:
        return None

    async def sign(
        self, method: str, url: str, headers: dict[str, str], *, origin: str
    ) -> dict[str, str]:
        # Same scheme too: a redirect from https to http must not carry a token in clear.
        if same_origin(url, origin):
            headers = {**self._headers, **headers}
        return headers

    async def error_detail(self, response: Any) -> str:
        return reason_of(response)

    def describe_denied(self, url: str, status: int, detail: str) -> str:
        given = "with the configured headers" if self._headers else "without credentials"
        return (
            f"{url}: HTTP {status} {detail}; the request was sent {given}. Check the token "
            "(e.g. headers={'Authorization': 'Bearer ...'}) and that it may read this file"
        )
