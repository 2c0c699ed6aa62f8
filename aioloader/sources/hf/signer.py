"""The Hub's token on the Hub's requests only.

A ``resolve`` URL answers a weights file with a redirect to a storage host, whose
URL carries its own signature: the token must never reach it. The token goes to
the Hub's endpoint origin (scheme, host and port) and nowhere else, whatever
URL the load was asked for.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

from ..http.rules import same_origin
from ..http.signer import reason_of

if TYPE_CHECKING:
    from .hub import HubSettings

__all__ = ["HubSigner"]


class HubSigner:
    """Signs requests to the Hub (see the module docstring).

    It signs nothing until ``use`` gives it the Hub's settings.
    """

    follow_redirects = True
    encoded_urls = False

    def __init__(self) -> None:
        self.endpoint = ""
        self._token: str | None = None

    def __repr__(self) -> str:
        return f"<HubSigner {self.endpoint!r} token={'set' if self._token else None}>"

    def use(self, settings: HubSettings) -> None:
        """Send ``settings.token`` to ``settings.endpoint`` from now on."""
        self.endpoint, self._token = settings.endpoint, settings.token

    async def ssl_context(self) -> ssl.SSLContext | None:
        return None

    async def sign(
        self, method: str, url: str, headers: dict[str, str], *, origin: str
    ) -> dict[str, str]:
        if self._token and self.endpoint and same_origin(url, self.endpoint):
            headers = {**headers, "Authorization": f"Bearer {self._token}"}
        return headers

    async def error_detail(self, response: Any) -> str:
        message = response.headers.get("X-Error-Message")
        return str(message) if message else reason_of(response)

    def describe_denied(self, url: str, status: int, detail: str) -> str:
        given = "with a Hugging Face token" if self._token else "without a token"
        return (
            f"{url}: HTTP {status} {detail}; the request was sent {given}. Log in with "
            "`huggingface-cli login` (or set HF_TOKEN), and accept the model's licence on its "
            "page if it is gated"
        )
