"""Secrets cut out of URLs before they reach an error message, a log line or an API answer.

Presigned and token URLs carry their credentials in the query string (S3's
``X-Amz-Signature``/``X-Amz-Credential``/``X-Amz-Security-Token``, Azure SAS
``sig``/``se``/``sp``/``sv``, GCS ``X-Goog-Signature``, CloudFront ``Signature``/
``Key-Pair-Id``, ``token=``, ``access_token=`` ...) or in their user info
(``https://user:password@host/``). ``redact`` rewrites every URL found in a text:

- the user info becomes ``REDACTED`` (``https://REDACTED@host/...``): a user name
  alone is often a token too;
- in the query string and the fragment, every parameter keeps its name but its
  value becomes ``REDACTED``, except the few parameters in ``PUBLIC_PARAMETERS``,
  known to carry nothing secret (``X-Amz-Expires``, ``versionId``, ``download``...).

An allow-list rather than a list of secret names: storage services and CDNs keep
inventing names for their signatures, and an unknown one must not leak. The URL
stays readable: scheme, host, path and parameter names are kept as written.

``without_credentials`` names the object a URL points at, whoever signed it: the
user info and the parameters known to carry a signature or a credential are
dropped (a deny-list here: an unknown parameter may name the object, and keeping
it costs at most a second cache entry). The node cache keys its entries by it.

``redact`` is pure and idempotent. ``RedactingFilter`` applies it to log records.
A filter on a logger sees only that logger's own records, not its children's, so
every module makes its logger with ``redacting_logger(__name__)`` rather than
``logging.getLogger``; the ``aioloader`` logger itself gets the filter when this
module is imported.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from .message_filter import MessageFilter

__all__ = [
    "PUBLIC_PARAMETERS",
    "REDACTED",
    "RedactingFilter",
    "redact",
    "redacting_logger",
    "without_credentials",
]

REDACTED = "REDACTED"

PUBLIC_PARAMETERS = frozenset(
    {
        # SigV4 / GCS V4 presigning: how and until when, never the key or signature.
        "x-amz-algorithm",
        "x-amz-date",
        "x-amz-expires",
        "x-amz-signedheaders",
        "x-goog-algorithm",
        "x-goog-date",
        "x-goog-expires",
        "x-goog-signedheaders",
        "expires",
        # Which object and how to send it.
        "versionid",
        "x-id",
        "partnumber",
        "response-content-type",
        "response-content-disposition",
        "download",
        "revision",
    }
)
"""Query parameters (lower-cased) whose values are shown; every other value is redacted."""

# "scheme://" then the user info up to the last "@" before the host ends.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s'\"<>]*)@")
# One "name=value" after "?", "&" or "#" (query string or fragment).
_PARAMETER = re.compile(r"(?P<lead>[?&#])(?P<name>[^=&#?\s'\"<>]+)=(?P<value>[^&#\s'\"<>]*)")
# Punctuation closing a sentence or a bracket, kept when it ends a value.
_TRAILING = ".,:;!?)]}"


def _redact_parameter(match: re.Match[str]) -> str:
    name, value = match["name"], match["value"]
    if not value or unquote_plus(name).lower() in PUBLIC_PARAMETERS:
        return match[0]
    kept = value.rstrip(_TRAILING)
    tail = value[len(kept) :]
    if not kept or kept == REDACTED:
        return match[0]
    return f"{match['lead']}{name}={REDACTED}{tail}"


def redact(text: str) -> str:
    """``text`` with the secrets of every URL in it replaced by ``REDACTED``.

    >>> redact("GET https://u:pw@h/m.safetensors?X-Amz-Expires=60&X-Amz-Signature=ab12: 403")
    'GET https://REDACTED@h/m.safetensors?X-Amz-Expires=60&X-Amz-Signature=REDACTED: 403'
    """
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    if "=" in text:
        text = _PARAMETER.sub(_redact_parameter, text)
    return text


_CREDENTIAL_PARAMETERS = frozenset(
    {
        # Azure SAS
        "sv", "ss", "srt", "sp", "se", "st", "spr", "sig", "sr", "si", "sdd", "ses",
        "skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid",
        # CloudFront, GCS V2 signing
        "signature", "key-pair-id", "policy", "expires", "googleaccessid",
        # tokens in query strings
        "token", "access_token", "auth", "api_key", "apikey",
    }
)  # fmt: skip
_CREDENTIAL_PREFIXES = ("x-amz-", "x-goog-")  # every SigV4 / GCS V4 signing parameter


def _is_credential(name: str) -> bool:
    name = unquote_plus(name).lower()
    if name in ("x-amz-version-id",):
        return False
    return name in _CREDENTIAL_PARAMETERS or name.startswith(_CREDENTIAL_PREFIXES)


def without_credentials(url: str) -> str:
    """``url`` without user info and signing parameters: the object, not the signature.

    A URL that carries neither comes back unchanged; so does text that is not a URL.

    >>> without_credentials("https://u:p@h/m?versionId=3&X-Amz-Signature=ab&X-Amz-Date=1")
    'https://h/m?versionId=3'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    kept = [
        pair
        for pair in parts.query.split("&")
        if pair and not _is_credential(pair.partition("=")[0])
    ]
    query = "&".join(kept)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class RedactingFilter(MessageFilter):
    """Redacts a log record's message, its arguments and its traceback text.

    A filter on a logger sees only the records logged on that very logger, not
    those of its children: attach it with ``redacting_logger`` (or to a handler,
    which sees them all).
    """

    def rewrite(self, text: str) -> str:
        return redact(text)

    def filter(self, record: logging.LogRecord) -> bool:
        super().filter(record)
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            if redact(text) != text:
                record.exc_text = redact(text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = RedactingFilter()


def redacting_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the redacting filter attached (once)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


# The package's own logger only: no handler, level or anything outside aioloader is touched.
redacting_logger("aioloader")
