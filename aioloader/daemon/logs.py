"""Log lines no client can forge: control characters in a message are escaped.

The daemon logs text that others chose: URLs a client posted, paths it asked
for, error messages a remote server sent back. A newline in any of them would
start a line of the log that looks like the daemon's own (``INFO model ready``),
and an escape sequence could rewrite a terminal. So while the daemon serves,
``EscapingFilter`` sits on the root logger's handlers, after the redacting one,
and writes every control character of a record's message as a Python escape
(``\\n``, ``\\x1b``, ``\\u2028``). Tracebacks are left as they are: they are the
daemon's own text, formatted apart from the message.
"""

from __future__ import annotations

import re

from ..message_filter import MessageFilter

__all__ = ["EscapingFilter", "escape_controls"]

# C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with each control character written as its escape."""
    return _CONTROL.sub(_escaped, text)


class EscapingFilter(MessageFilter):
    """Escapes control characters in a record's message (see the module docstring)."""

    def rewrite(self, text: str) -> str:
        return escape_controls(text)
