"""The daemon's bearer token, read and checked at startup (pure but for the token file).

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

The token may come from a file (``--token-file``, ``AIOLOADER_TOKEN_FILE``: a
mounted Secret, which keeps it out of ``ps`` and of the pod's environment), read
once at startup (``token_text``) and checked as any token is. A token given twice
(a file and a flag or variable) is an error naming both, as is a file that does
not exist, is not a regular file, cannot be read, is not UTF-8 or is larger than
``MAX_TOKEN_FILE`` bytes (no token is: that is another file).

No token at all (neither flag, variable nor file) leaves ``/v1/*`` open only on a
loopback address (``check_open``), and the server says so in its log; a daemon
that other machines can reach (``--host 0.0.0.0``) refuses to start without a
token unless ``--no-auth`` makes that choice explicit.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import stat
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = [
    "MAX_TOKEN_FILE",
    "MIN_TOKEN_LENGTH",
    "PLACEHOLDERS",
    "Token",
    "check_open",
    "is_loopback",
    "read_token",
    "token_text",
]

MAX_TOKEN_FILE = 4096
"""Bytes a token file may hold: a token and its newline, with room to spare."""

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


def token_text(
    token: str | None,
    token_where: str,
    path: str | None,
    path_where: str,
    *,
    no_auth: bool = False,
) -> tuple[str | None, str]:
    """The token's text and where it came from, for ``read_token``: ``token`` as given
    (from ``token_where``: ``--token`` or ``AIOLOADER_TOKEN``), else the content of the
    file ``path`` (from ``path_where``: ``--token-file`` or ``AIOLOADER_TOKEN_FILE``).

    Raises:
        ConfigError: both given, a file with ``--no-auth``, or a file that cannot give
            a token (see the module); naming the file and where it was given.
    """
    if path is None:
        return token, token_where
    if token is not None:
        raise ConfigError(
            f"{token_where} and {path_where} both give the token: pick one (keep the file, "
            f"a mounted Secret that no `ps` shows, and unset {token_where})"
        )
    if no_auth:
        raise ConfigError(
            f"{path_where} is set, and so is --no-auth / AIOLOADER_NO_AUTH: pick one (unset "
            f"{path_where} to serve /v1/* without a token, or drop --no-auth)"
        )
    where = f"the token file {path} ({path_where})"
    return _read_file(path, where, f"give {path_where} a file holding the token alone"), where


def _read_file(path: str, where: str, fix: str) -> str:
    """The text of the token file; opened without blocking (a FIFO is refused, not
    waited on) and read up to one byte past ``MAX_TOKEN_FILE``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist: {fix}") from None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise ConfigError(f"{where} does not exist: {fix}") from None
        raise ConfigError(f"cannot read {where} ({exc.strerror}): {fix}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{where} is not a file (a folder, a pipe or a device): {fix}")
        if info.st_size > MAX_TOKEN_FILE:
            raise ConfigError(
                f"{where} is {info.st_size} bytes long, more than the {MAX_TOKEN_FILE} a "
                f"token file may hold: is it the right file? {fix}"
            )
        try:
            raw = os.read(fd, MAX_TOKEN_FILE + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read {where} ({exc.strerror}): {fix}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_TOKEN_FILE:  # it grew since fstat
        raise ConfigError(f"{where} holds more than {MAX_TOKEN_FILE} bytes: {fix}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text; {HOW_TO_MAKE} and write it there") from None


def is_loopback(host: str) -> bool:
    """Whether only this machine reaches ``host``: ``localhost``, or a loopback
    address (``127.0.0.0/8``, ``::1``, bracketed or not)."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_open(host: str, token: str | None, no_auth: bool) -> None:
    """Refuse a daemon that other machines reach with ``/v1/*`` open by accident.

    Raises:
        ConfigError: no token, no ``--no-auth``, and ``host`` is not a loopback
            address; saying how to make a token.
    """
    if token is not None or no_auth or is_loopback(host):
        return
    raise ConfigError(
        f"--host {host} lets other machines reach the daemon, and no token is set: /v1/* "
        f"would be open to anyone on the network; {HOW_TO_MAKE} and give it with "
        "AIOLOADER_TOKEN (from a Secret), --token-file or --token, or pass --no-auth "
        "(AIOLOADER_NO_AUTH=1) to serve without a token on purpose"
    )
