"""What the environment says about Azure storage, read in one place.

``AZURE_STORAGE_CONNECTION_STRING`` (``AccountName``, ``AccountKey``,
``BlobEndpoint``: Azurite's too), else ``AZURE_STORAGE_ACCOUNT_NAME``,
``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_ACCOUNT_KEY`` and ``AZURE_STORAGE_SAS_TOKEN``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["SUFFIX", "AzureSettings"]

SUFFIX = ".blob.core.windows.net"
CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
_KEY_NAMES = ("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY")  # the CLI's, and another usual


@dataclass(frozen=True)
class AzureSettings:
    """The account the environment names, and the secrets it holds for that account.

    Attributes:
        account: the account named (``AccountName``, else ``AZURE_STORAGE_ACCOUNT_NAME``).
        endpoint: its blob endpoint (``BlobEndpoint``, else Azure's), no trailing slash.
        key: an account key (``AccountKey``, else ``AZURE_STORAGE_KEY`` /
            ``AZURE_STORAGE_ACCOUNT_KEY``), and ``key_from``, the variable it came from.
        sas: ``AZURE_STORAGE_SAS_TOKEN``.
    """

    account: str | None = None
    endpoint: str = ""
    key: str | None = None
    key_from: str = ""
    sas: str = ""

    @classmethod
    def from_environ(cls) -> AzureSettings:
        """The settings as the environment holds them now."""
        text = os.environ.get(CONNECTION_STRING, "")
        parts = (item.partition("=") for item in text.split(";") if "=" in item)
        connection = {key.strip(): value.strip() for key, _, value in parts}
        account = connection.get("AccountName") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        endpoint = connection.get("BlobEndpoint") or f"https://{account}{SUFFIX}"
        key, key_from = connection.get("AccountKey"), CONNECTION_STRING
        if not key:
            key_from = next((n for n in _KEY_NAMES if os.environ.get(n)), "")
            key = os.environ[key_from] if key_from else None
        return cls(
            account=account or None,
            endpoint=endpoint.rstrip("/") if account else "",
            key=key,
            key_from=key_from if key else "",
            sas=os.environ.get("AZURE_STORAGE_SAS_TOKEN", ""),
        )

    def names_another(self, account: str, endpoint: str) -> bool:
        """The environment names an account other than ``account`` at ``endpoint``: its
        SAS and key belong to that one, never to be sent to this."""
        return self.account is not None and (
            self.account != account or self.endpoint.lower() != endpoint.lower()
        )
