"""A logging filter that rewrites each record's message with one function of the text.

The loader's logs redact secrets (redact.py) and the daemon's escape control characters
(daemon/logs.py): both format the message once, rewrite it, and put the result back
only when it changed, so an untouched record keeps its ``msg`` and ``args``.
"""

from __future__ import annotations

import logging

__all__ = ["MessageFilter"]


class MessageFilter(logging.Filter):
    """Rewrites a record's formatted message with ``rewrite``; never drops a record.

    A record whose message cannot be formatted (a malformed ``%`` call) passes as it is,
    for the handler to report.
    """

    def rewrite(self, text: str) -> str:
        """The text to log instead of ``text``."""
        raise NotImplementedError

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it for the handler to report
            return True
        clean = self.rewrite(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True
