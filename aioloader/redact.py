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

``redact`` is pure and idempotent. ``RedactingFilter`` applies it to log records;
it is installed on the ``aioloader`` logger when this module is imported.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

__all__ = ["PUBLIC_PARAMETERS", "REDACTED", "RedactingFilter", "redact", "redacting_logger"]

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


class RedactingFilter(logging.Filter):
    """Redacts a log record's message, its arguments and its traceback text.

    A filter on a logger sees only the records logged on that very logger, not
    those of its children: attach it with ``redacting_logger`` (or to a handler,
    which sees them all).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it for the handler to report
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
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
