"""hf:// URLs: ``hf://org/name[@revision][/path]``, parsed and checked (pure).

The revision is a branch, a tag or a commit sha; it is percent-decoded, so a
branch with a slash is written ``feature%2Fx`` (``refs/pr/N`` and
``refs/convert/NAME`` may also be written as they are). The path, a folder or a
file of the repository, is taken as written: it is a name looked up in the
repository's listing, never decoded (``#`` and ``?`` in it are part of a name: an
hf:// URL has no query or fragment). Everything is checked in its final form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ...errors import ConfigError

__all__ = ["DEFAULT_REVISION", "MAX_URL", "HfLocation", "is_commit", "parse_hf_url", "reads_back"]

DEFAULT_REVISION = "main"
MAX_URL = 4096
_PREFIX = "hf://"
# The Hub's rule for an owner or a repository name: letters, digits, "_", "-" and
# ".", at most 96, starting and ending with a letter, digit or "_", no "--" or "..".
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SPECIAL_REF = re.compile(r"refs/(?:pr/[0-9]+|convert/[A-Za-z0-9_.-]+)")
# Characters git refuses in a ref name, besides control characters.
_BAD_REF_CHARS = frozenset(" ~^:?*[\\")
_HINT = "write hf://org/name, hf://org/name@revision or hf://org/name@revision/path"


def is_commit(revision: str) -> bool:
    """Whether ``revision`` is a full commit sha (40 lower-case hex digits)."""
    return _COMMIT.fullmatch(revision) is not None


@dataclass(frozen=True)
class HfLocation:
    """A place in a Hub model repository.

    Attributes:
        repo_id: ``org/name``.
        revision: the branch, tag or commit sha as given (``main`` when none was).
        path: a file or folder in the repository, ``""`` for its root.
    """

    repo_id: str
    revision: str = DEFAULT_REVISION
    path: str = ""

    def url(self) -> str:
        """The hf:// URL of this location, in the form ``parse_hf_url`` reads back."""
        url = f"{_PREFIX}{self.repo_id}@{quote(self.revision, safe='')}"
        return url + "/" + self.path if self.path else url

    def at(self, revision: str | None = None, path: str | None = None) -> HfLocation:
        """The same repository at another revision or path."""
        return HfLocation(
            self.repo_id,
            self.revision if revision is None else revision,
            self.path if path is None else path,
        )


def parse_hf_url(url: object) -> HfLocation:
    """Read ``hf://org/name[@revision][/path]``.

    Raises:
        ConfigError: not a string, too long, or not a well-formed hf:// URL; the
            message says which part is wrong.
    """
    if not isinstance(url, str):
        raise ConfigError(f"an hf:// URL must be a str, not {type(url).__name__}")
    if len(url) > MAX_URL:
        raise ConfigError(
            f"{url[:60]}...: the URL is {len(url)} characters long, over {MAX_URL}; {_HINT}"
        )
    if url[: len(_PREFIX)].lower() != _PREFIX:
        raise ConfigError(f"{url} is not an hf:// URL; {_HINT}")
    rest = url[len(_PREFIX) :]
    parts = rest.split("/")
    if "?" in "/".join(parts[:2]) or "#" in "/".join(parts[:2]):
        # In the path they are a file's name ("a#b.txt"): names are taken as written.
        raise ConfigError(f"{url}: an hf:// URL has no query or fragment; {_HINT}")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ConfigError(f"{url} names no repository; {_HINT}")
    owner, name_rev, tail = parts[0], parts[1], parts[2:]
    name, at, revision = name_rev.partition("@")
    if not at:
        revision = DEFAULT_REVISION
    elif "@" in revision:
        raise ConfigError(f"{url}: '@' appears twice in the repository part; {_HINT}")
    elif not revision:
        raise ConfigError(f"{url}: the revision after '@' is empty; {_HINT}")
    for label, value in (("owner", owner), ("repository name", name)):
        if not _NAME.fullmatch(value) or "--" in value or ".." in value:
            raise ConfigError(
                f"{url}: {value!r} is not a valid {label} on the Hub (letters, digits, '_', "
                "'-' and '.', at most 96, no '--' or '..'); check the name"
            )
    if at and revision == "refs" and tail and _SPECIAL_REF.fullmatch("/".join(["refs", *tail[:2]])):
        revision, tail = "/".join(["refs", *tail[:2]]), tail[2:]
    else:
        revision = unquote(revision)
    problem = _revision_problem(revision)
    if problem:
        raise ConfigError(f"{url}: the revision {revision!r} {problem}; {_HINT}")
    if tail and tail[-1] == "":
        tail = tail[:-1]  # a folder written with its trailing slash
    for segment in tail:
        problem = _segment_problem(segment)
        if problem:
            raise ConfigError(f"{url}: the path segment {segment!r} {problem}; {_HINT}")
    return HfLocation(f"{owner}/{name}", revision, "/".join(tail))


def reads_back(location: HfLocation, url: str) -> bool:
    """Whether ``parse_hf_url(url)`` gives ``location``, for ``url = location.url()``
    where ``location``'s repository was parsed already: the URL is not too long and its
    revision and every path segment pass the checks above (a name joined from a
    listing or an index may not: that URL is then parsed, and refused, when read)."""
    segments = location.path.split("/") if location.path else []
    return (
        len(url) <= MAX_URL
        and location.revision != "refs"  # "@refs/pr/1/x" reads as the ref refs/pr/1
        and _revision_problem(location.revision) is None
        and all(_segment_problem(segment) is None for segment in segments)
    )


def _revision_problem(revision: str) -> str | None:
    if not revision:
        return "is empty"
    if len(revision) > 255:
        return "is longer than 255 characters"
    if any(ord(c) < 0x20 or c == "\x7f" or c in _BAD_REF_CHARS for c in revision):
        return "holds a character git refuses in a ref (control, space, ~^:?*[\\)"
    if ".." in revision or "@{" in revision or "//" in revision:
        return "holds '..', '@{' or '//', which git refuses in a ref"
    if revision.startswith(("/", "-", ".")) or revision.endswith(("/", ".", ".lock")):
        return "starts or ends in a way git refuses in a ref"
    return None


def _segment_problem(segment: str) -> str | None:
    if not segment:
        return "is empty (two slashes in a row)"
    if segment in (".", ".."):
        return "is '.' or '..'; name files and folders inside the repository"
    if any(ord(c) < 0x20 or c == "\x7f" for c in segment):
        return "holds a control character"
    if "\\" in segment:
        return "holds a backslash"
    return None
