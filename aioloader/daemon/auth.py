"""The daemon's bearer token, read and checked at startup (pure; no I/O).

Every way a token can go wrong without a word is refused or said aloud:

- surrounding whitespace (the newline a file or ``echo`` leaves, a Secret made
  with ``--from-file``) is stripped, with a warning: clients send the token
  without it, and would all be refused otherwise;
- a variable that is set but empty would turn authentication off: it is an
  error, unless ``--no-auth`` says that no token is wanted;
- a known placeholder (``change-me``, as a sample Secret ships) or a token
  shorter than ``MIN_TOKEN_LENGTH`` is refused, saying how to make a real one;
- a token that an HTTP header cannot carry (inner spaces, control or non-ASCII
  characters) is refused: no client could send it.

No token at all (neither flag nor variable) leaves ``/v1/*`` open, as before;
the server says so in its log, and ``--no-auth`` makes that choice explicit.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["MIN_TOKEN_LENGTH", "PLACEHOLDERS", "Token", "read_token"]

MIN_TOKEN_LENGTH = 16
"""Fewer characters than this is a password, not a token."""

PLACEHOLDERS = frozenset(
    {
        "change-me", "changeme", "change_me", "change-this", "changethis", "replace-me",
        "replaceme", "replace_me", "secret", "token", "password", "example", "placeholder",
        "your-token", "your-token-here", "<token>", "todo", "xxx", "dummy", "test", "default",
    }
)  # fmt: skip
"""Tokens that samples and manifests ship: never a real secret."""

HOW_TO_MAKE = "make one with `openssl rand -hex 32`"


@dataclass(frozen=True)
class Token:
    """The token the daemon checks, and what its reading had to say.

    Attributes:
        value: the token, or None when ``/v1/*`` takes no token.
        notes: warnings for the log (such as whitespace stripped); never the token.
    """

    value: str | None
    notes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Token({'set' if self.value else None}, notes={len(self.notes)})"


def read_token(raw: str | None, where: str, *, no_auth: bool = False) -> Token:
    """The token given as ``raw`` (from ``where``: the flag or variable), checked.

    Args:
        raw: the value as given; None when neither flag nor variable is set.
        where: ``--token`` or ``AIOLOADER_TOKEN``, for messages.
        no_auth: ``--no-auth``: serve ``/v1/*`` without a token, on purpose.

    Raises:
        ConfigError: naming ``where`` and what to do; never showing the token.
    """
    if raw is None:
        return Token(None)
    value = raw.strip()
    if no_auth:
        if value:
            raise ConfigError(
                f"{where} is set, and so is --no-auth / AIOLOADER_NO_AUTH: pick one (unset "
                "the token to serve /v1/* without one, or drop --no-auth)"
            )
        return Token(None)
    if not value:
        raise ConfigError(
            f"{where} is set but empty, which would leave /v1/* open to anyone who reaches "
            f"the daemon; {HOW_TO_MAKE} and set it, or pass --no-auth (AIOLOADER_NO_AUTH=1) "
            "to serve without a token on purpose"
        )
    if value.lower() in PLACEHOLDERS:
        raise ConfigError(
            f"{where} is the placeholder {value!r}, which anyone can guess; {HOW_TO_MAKE} "
            "and put it in the Secret (kubectl -n aioloader create secret generic "
            "aioloader-token --from-literal=token=$(openssl rand -hex 32))"
        )
    if any(not 0x21 <= ord(c) <= 0x7E for c in value):
        raise ConfigError(
            f"{where} holds a space, a control character or a non-ASCII character, which "
            f"no client can send in an Authorization header; {HOW_TO_MAKE}"
        )
    if len(value) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"{where} is {len(value)} characters long, too short to keep anyone out; use "
            f"{MIN_TOKEN_LENGTH} or more: {HOW_TO_MAKE}"
        )
    notes: tuple[str, ...] = ()
    if value != raw:
        notes = (
            f"{where} had whitespace around it (such as the newline a file ends with); it "
            "was stripped: clients send the token without it",
        )
    return Token(value, notes)
