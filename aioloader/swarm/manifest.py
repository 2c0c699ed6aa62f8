"""What a daemon offers per model (``GET /v1/swarm/models/{key}``), and its checks.

A manifest::

    {"key": <model_key(url)>, "url": <redacted URL>, "node": <node id>,
     "swarm": "ip:port", "state": "fetching" | "following" | "complete",
     "files": [{"name": path within the origin, "url" (redacted), "size", "etag",
                "last_modified", "done": bytes held, "info_hash": v2 hex | null,
                "ranges" (a large file of a split, ranges.py): [{"offset", "length",
                "done", "info_hash" of the range torrent | null}]}],
     "origin_requests": the cluster's cap on requests in flight to an origin, as
                        this node is configured (absent: no cap),
     "split": the node ids that pull the model from the origin in this node's deal,
              in node order (a node that fetches; absent: none dealt yet; deal.py),
     "throttled": [{"origin": "scheme://host:port", "count": throttling answers
                    this node got from it, "resume_in": seconds left of its pause}]}

``state``: ``fetching``, the node pulls the model from the origin (it leads); ``following``,
it waits for or downloads from another node (or has not chosen yet): nobody follows it,
or two nodes could each wait for the other; ``complete``, it holds every file.

``model_key`` is the sha256 of the URL without user info and without the query
parameters that sign it (``redact.without_credentials``, as the node cache keys its
entries): every node computes the same key for the same object, whoever signed its
URL, while the parameters that name a version (``?rev=2``, S3 ``versionId``, GCS
``generation``, Azure ``snapshot``) keep versions apart; neither the key nor the
manifest carries a secret. A file goes by its path within the origin (``file_name``),
so ``a/model.safetensors`` and ``b/model.safetensors`` never meet; its torrent is
named by the last segment. A manifest comes from a peer, which may lie: ``parse`` checks every field
(types, sizes, names that could leave a folder, info hashes) and refuses the whole
manifest, naming the peer; ``check_torrent`` checks a torrent fetched by its info
hash against the file it is for.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ..errors import FormatError
from ..redact import redact, without_credentials
from .pullers import parse_split
from .ranges import RangeOffer, parse_ranges

T = TypeVar("T")

__all__ = [
    "MAX_FILE_SIZE",
    "MAX_ORIGIN_REQUESTS",
    "FileOffer",
    "Manifest",
    "ManifestError",
    "check_torrent",
    "file_name",
    "model_key",
    "parse",
    "swarm_address",
    "Throttled",
    "torrent_name",
]

State = Literal["fetching", "following", "complete"]
Describe = Callable[[bytes], tuple[str, int]]

MAX_FILE_SIZE = 1 << 50  # 1 PiB: larger is a lie
MAX_FILES = 100_000
MAX_TORRENT = 32 << 20  # bytes of one file's torrent (a v2 torrent holds 32 B a piece)
_MAX_TEXT = 4096
MAX_ORIGIN_REQUESTS = 4096
"""The largest cluster-wide cap on requests in flight to one origin."""
_MAX_THROTTLED = 16  # origins in one manifest's ``throttled``
_MAX_COUNT = (1 << 31) - 1
_MAX_PAUSE = 3600.0  # seconds: a larger ``resume_in`` is a lie (and is capped when heeded)
_HEX = re.compile(r"^[0-9a-f]+$")


class ManifestError(FormatError):
    """A peer's manifest that cannot be trusted; it is ignored."""


def model_key(url: str) -> str:
    """sha256 hex of ``url`` without user info, signing parameters and fragment; the
    parameters that pick a version stay (``redact.without_credentials``)."""
    bare = without_credentials(url)
    try:
        parts = urlsplit(bare)
    except ValueError:
        parts = None
    if parts is not None:
        bare = urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))
    return hashlib.sha256(bare.encode()).hexdigest()


def file_name(url: str) -> str:
    """The name a file of a model goes by in a manifest: its URL's path within the
    origin (no leading ``/``, no query), so that two files of one base name in
    different folders keep apart."""
    try:
        path = urlsplit(url).path
    except ValueError:
        path = url
    return path.strip("/") or path


def torrent_name(name: str) -> str:
    """The name the torrent of the manifest file ``name`` gives its file: the last
    segment (a torrent's one file has a plain name)."""
    return name.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class FileOffer:
    """One file of a manifest; ``info_hash`` once the node holds it whole and seeds it.

    ``torrent`` is the torrent's bytes where this node made or fetched it; a manifest
    names only its info hash, and a peer fetches the torrent once, by that hash
    (``GET /v1/swarm/torrents/{info_hash}``, checked by ``check_torrent``): a manifest
    asked for twice a second stays small whatever the torrents weigh."""

    name: str
    url: str
    size: int
    etag: str | None = None
    last_modified: str | None = None
    done: int = 0
    torrent: bytes | None = field(default=None, compare=False, repr=False)
    info_hash: str | None = None
    ranges: tuple[RangeOffer, ...] = ()

    def as_dict(self) -> dict[str, object]:
        ranges = {"ranges": [r.as_dict() for r in self.ranges]} if self.ranges else {}
        return ranges | {
            "name": self.name,
            "url": redact(self.url),
            "size": self.size,
            "etag": self.etag,
            "last_modified": self.last_modified,
            "done": self.done,
            "info_hash": self.info_hash,
        }


@dataclass(frozen=True)
class Throttled:
    """Throttling answers a node got from one origin: how many, and the seconds left of
    the pause the last one asked for (runtime/throttle.py ``Origin``)."""

    origin: str
    count: int
    resume_in: float

    def as_dict(self) -> dict[str, object]:
        return {"origin": self.origin, "count": self.count, "resume_in": self.resume_in}


@dataclass(frozen=True)
class Manifest:
    key: str
    url: str
    node: str
    swarm: str
    state: State = "following"
    files: tuple[FileOffer, ...] = field(default=())
    origin_requests: int | None = None
    split: tuple[str, ...] = ()
    # Not progress: a peer whose manifest changes only here has not moved (followed.py).
    throttled: tuple[Throttled, ...] = field(default=(), compare=False)

    def file(self, name: str) -> FileOffer | None:
        return next((f for f in self.files if f.name == name), None)

    def without(self, name: str) -> Manifest:
        files = tuple(f for f in self.files if f.name != name)
        state: State = "following" if self.state == "complete" else self.state
        return replace(self, files=files, state=state)

    def with_file(self, offer: FileOffer) -> Manifest:
        files = [f for f in self.files if f.name != offer.name]
        return replace(self, files=(*files, offer))

    def as_dict(
        self, swarm: str | None = None, throttled: tuple[Throttled, ...] | None = None
    ) -> dict[str, object]:
        doc: dict[str, object] = {
            "key": self.key,
            "url": redact(self.url),
            "node": self.node,
            "swarm": swarm or self.swarm,
            "state": self.state,
            "files": [f.as_dict() for f in self.files],
        }
        if self.origin_requests is not None:
            doc["origin_requests"] = self.origin_requests
        if self.split:
            doc["split"] = list(self.split)
        shown = self.throttled if throttled is None else throttled
        if shown:
            doc["throttled"] = [t.as_dict() for t in shown]
        return doc


def _optional_text(value: object, what: str, *, limit: int = _MAX_TEXT) -> str | None:
    return None if value is None else _text(value, what, limit=limit)


def _text(value: object, what: str, *, limit: int = _MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ManifestError(f"{what} is not a string of at most {limit} characters")
    if any(not c.isprintable() for c in value):
        raise ManifestError(f"{what} holds a control character")
    return value


def _count(value: object, what: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise ManifestError(f"{what} is not an integer from 0 to {top}")
    return value


MAX_NAME = 1024
"""Characters of a file's path in a manifest; 255 a segment."""


def _name(value: object, what: str) -> str:
    name = _text(value, what, limit=MAX_NAME)
    segments = name.split("/")
    if (
        not name
        or "\\" in name
        or "\0" in name
        or any(s in ("", ".", "..") or len(s) > 255 for s in segments)
    ):
        raise ManifestError(
            f"{what} {name!r:.80} is not a relative path of plain names (no empty, '.' or "
            "'..' segment, no backslash, at most 255 characters a segment)"
        )
    return str(name)


def swarm_address(value: object) -> str:
    """``value`` checked as a swarm address, ``ip:port``.

    Raises:
        ManifestError: it is not one.
    """
    text = _text(value, "swarm", limit=64)
    host, sep, port = text.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ManifestError(f"swarm {text!r:.80} is not ip:port") from None
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ManifestError(f"swarm {text!r:.80} is not ip:port")
    return str(text)


def _info_hash(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or not _HEX.match(value):
        raise ManifestError(f"{what} is not a v2 info hash (64 hex digits)")
    return value


def check_torrent(
    raw: bytes, offer: FileOffer, describe: Describe, hash_of: Callable[[bytes], str]
) -> bytes:
    """``raw``, a peer's torrent of ``offer``'s file, checked (blocking: it is parsed):
    it must have the offer's info hash and describe the file's name and size.

    Raises:
        ManifestError: it is not that torrent.
    """
    what = f"the torrent of {offer.name}"
    if len(raw) > MAX_TORRENT:
        raise ManifestError(f"{what} is over {MAX_TORRENT} bytes")
    try:
        t_name, t_size = describe(raw)
        digest = hash_of(raw)
    except ValueError as exc:
        raise ManifestError(f"{what} is not a usable torrent: {exc}") from None
    if digest != offer.info_hash:
        raise ManifestError(f"{what} has the info hash {digest[:16]}, not {offer.info_hash}")
    if t_size != offer.size:
        raise ManifestError(f"{what} describes {t_size} bytes, the manifest says {offer.size}")
    if t_name != torrent_name(offer.name):
        raise ManifestError(
            f"{what} describes a file {t_name!r:.80}, not {torrent_name(offer.name)!r}"
        )
    return raw


def _offer(raw: object, i: int) -> FileOffer:
    what = f"files[{i}]"
    if not isinstance(raw, dict):
        raise ManifestError(f"{what} is not an object")
    name = _name(raw.get("name"), f"{what}.name")
    size = _count(raw.get("size"), f"{what}.size", MAX_FILE_SIZE)
    return FileOffer(
        name=name,
        url=_text(raw.get("url"), f"{what}.url"),
        size=size,
        etag=_optional_text(raw.get("etag"), f"{what}.etag", limit=1024),
        last_modified=_optional_text(raw.get("last_modified"), f"{what}.last_modified"),
        done=_count(raw.get("done", 0), f"{what}.done", size),
        info_hash=_info_hash(raw.get("info_hash"), f"{what}.info_hash"),
        ranges=_checked(parse_ranges, raw.get("ranges"), size, what),
    )


def _checked(parse: Callable[..., T], *args: object) -> T:
    try:
        return parse(*args)
    except ValueError as exc:
        raise ManifestError(str(exc)) from None


def _throttled(raw: object) -> tuple[Throttled, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > _MAX_THROTTLED:
        raise ManifestError(f"throttled is not a list of at most {_MAX_THROTTLED}")
    found = []
    for i, item in enumerate(raw):
        what = f"throttled[{i}]"
        if not isinstance(item, dict):
            raise ManifestError(f"{what} is not an object")
        resume_in = item.get("resume_in")
        if (
            isinstance(resume_in, bool)
            or not isinstance(resume_in, (int, float))
            or not 0 <= resume_in <= _MAX_PAUSE  # NaN fails this too
        ):
            raise ManifestError(f"{what}.resume_in is not a number of seconds from 0 to 3600")
        found.append(
            Throttled(
                _text(item.get("origin"), f"{what}.origin", limit=256),
                _count(item.get("count"), f"{what}.count", _MAX_COUNT),
                float(resume_in),
            )
        )
    if len({t.origin for t in found}) != len(found):
        raise ManifestError("throttled names an origin twice")
    return tuple(found)


def parse(doc: object, peer: str, key: str) -> Manifest:
    """The manifest a peer sent for the model ``key`` (its torrents, fetched by their
    info hash, are checked by ``check_torrent``).

    Args:
        doc: the decoded JSON.
        peer: names the peer in errors.

    Raises:
        ManifestError: any field missing, of the wrong type, too large, a name that is
            not a relative path of plain names, twice the same name, an info hash that
            is not one; naming the peer.
    """
    try:
        if not isinstance(doc, dict):
            raise ManifestError("it is not a JSON object")
        got = _text(doc.get("key"), "key", limit=64)
        if got != key:
            raise ManifestError(f"it is for the model {got!r:.80}, not {key}")
        node = _text(doc.get("node"), "node", limit=64)
        if not node or not _HEX.match(node):
            raise ManifestError("node is not a hex id")
        state = doc.get("state")
        if state not in ("fetching", "following", "complete"):
            raise ManifestError(f"state {state!r:.40} is not fetching, following or complete")
        files = doc.get("files")
        if not isinstance(files, list) or len(files) > MAX_FILES:
            raise ManifestError(f"files is not a list of at most {MAX_FILES}")
        offers = tuple(_offer(raw, i) for i, raw in enumerate(files))
        if len({o.name for o in offers}) != len(offers):
            raise ManifestError("it names a file twice")
        cap = doc.get("origin_requests")
        if cap is not None:
            cap = _count(cap, "origin_requests", MAX_ORIGIN_REQUESTS)
            if cap == 0:
                raise ManifestError("origin_requests is 0 (absent means no cap)")
        return Manifest(
            key=key,
            url=_text(doc.get("url"), "url"),
            node=node,
            swarm=swarm_address(doc.get("swarm")),
            state=state,
            files=offers,
            origin_requests=cap,
            split=_checked(parse_split, doc.get("split")),
            throttled=_throttled(doc.get("throttled")),
        )
    except ManifestError as exc:
        raise ManifestError(f"peer {peer}: its manifest of {key[:12]} is refused: {exc}") from None
