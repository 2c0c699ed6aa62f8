"""The cluster's view (``GET /v1/swarm/view``, docs/swarm.md "Seeing the cluster"): per
node and per model, file by file, who holds, pulls or follows what, at what rate, and
the bytes from the origin and from peers. Plain values here; looking.py fills them from
what a node tracks, diagnosis.py reads them.

A node's view (``NodeView.as_dict``)::

    {"node": <id>, "api": "host:port" | null, "swarm": "ip:port", "time": <unix s>,
     "bytes_from_origin": n, "bytes_from_peers": n,
     "download_rate": B/s, "upload_rate": B/s, "banned": n, "flags": [...],
     "models": [{"key", "url" (redacted), "state": "fetching" | "following" | "complete",
                 "bytes_from_origin", "bytes_from_peers", "flags": [...],
                 "files": [{"name", "size", "done",
                            "role": "origin" | "follows" | "holds" | "seeds" | "waiting",
                            "follows": <node id> | null, "follows_api": "host:port" | null,
                            "rate": B/s coming in, "upload_rate": B/s going out,
                            "peers": swarm peers connected for it,
                            "bytes_from_origin", "bytes_from_peers", "flags": [...],
                            "ranges": [{"offset", "length", "done",
                                        "role": "origin" | "follows" | "holds",
                                        "node": <its puller's id> | null}]}]}]}

A file dealt in byte ranges (ranged.py) lists how each range comes: read here from the
``origin``, ``follows`` its puller ``node``, or ``holds`` (here); its ``done`` counts all.

The cluster's (``ClusterView.as_dict``): ``{"nodes": [<node view>, ...], "unreachable":
[{"api": "host:port", "reason": "..."}]}``, the node asked first.

Another node's view comes from a peer, which may be buggy or lie: ``parse_node`` refuses
a view of the wrong shape (a type, a missing field, too many entries: the peer is then
listed unreachable, with the reason), and keeps values that are impossible (a file 200 %
done, negative bytes, an unknown role) as reported, each named in the entry's ``flags``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from ..errors import FormatError
from .manifest import MAX_FILE_SIZE, MAX_FILES
from .ranges import MAX_RANGES

__all__ = [
    "MAX_MODELS",
    "RANGE_ROLES",
    "ROLES",
    "STATES",
    "ClusterView",
    "FileView",
    "ModelView",
    "NodeView",
    "RangeView",
    "Unreachable",
    "ViewError",
    "parse_cluster",
    "parse_node",
    "parse_one",
]

ROLES = ("origin", "follows", "holds", "seeds", "waiting")
RANGE_ROLES = ("origin", "follows", "holds")
STATES = ("fetching", "following", "complete")
MAX_MODELS = 1024  # models one node's view may list
MAX_NODES = 4096  # nodes (answering or not) a cluster's view may list
_MAX_TEXT = 4096
_ID = re.compile(r"^[0-9a-f]{1,64}$")


class ViewError(FormatError):
    """A view of the wrong shape: not usable at all."""


@dataclass(frozen=True)
class RangeView:
    """How one byte range of a file dealt in ranges comes to a node (``RANGE_ROLES``)."""

    offset: int
    length: int
    done: int
    role: str
    node: str | None = None  # the range's puller

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in ("offset", "length", "done", "role", "node")}


@dataclass(frozen=True)
class FileView:
    name: str
    size: int
    done: int
    role: str
    follows: str | None = None
    follows_api: str | None = None
    rate: float = 0.0
    upload_rate: float = 0.0
    peers: int = 0
    bytes_from_origin: int = 0
    bytes_from_peers: int = 0
    flags: tuple[str, ...] = ()
    ranges: tuple[RangeView, ...] = ()

    @property
    def fraction(self) -> float | None:
        """How much of the file is here (None: it has no size)."""
        return self.done / self.size if self.size > 0 else None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "size": self.size,
            "done": self.done,
            "role": self.role,
            "follows": self.follows,
            "follows_api": self.follows_api,
            "rate": round(float(self.rate), 1),
            "upload_rate": round(float(self.upload_rate), 1),
            "peers": self.peers,
            "bytes_from_origin": self.bytes_from_origin,
            "bytes_from_peers": self.bytes_from_peers,
            "flags": list(self.flags),
            "ranges": [r.as_dict() for r in self.ranges],
        }


@dataclass(frozen=True)
class ModelView:
    key: str
    url: str  # redacted
    state: str
    files: tuple[FileView, ...] = ()
    bytes_from_origin: int = 0
    bytes_from_peers: int = 0
    flags: tuple[str, ...] = ()

    def file(self, name: str) -> FileView | None:
        return next((f for f in self.files if f.name == name), None)

    def as_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "url": self.url,
            "state": self.state,
            "bytes_from_origin": self.bytes_from_origin,
            "bytes_from_peers": self.bytes_from_peers,
            "flags": list(self.flags),
            "files": [f.as_dict() for f in self.files],
        }


@dataclass(frozen=True)
class NodeView:
    node: str
    api: str | None
    swarm: str
    time: float
    models: tuple[ModelView, ...] = ()
    bytes_from_origin: int = 0
    bytes_from_peers: int = 0
    download_rate: float = 0.0
    upload_rate: float = 0.0
    banned: int = 0
    flags: tuple[str, ...] = ()

    def model(self, key: str) -> ModelView | None:
        return next((m for m in self.models if m.key == key), None)

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "api": self.api,
            "swarm": self.swarm,
            "time": self.time,
            "bytes_from_origin": self.bytes_from_origin,
            "bytes_from_peers": self.bytes_from_peers,
            "download_rate": round(float(self.download_rate), 1),
            "upload_rate": round(float(self.upload_rate), 1),
            "banned": self.banned,
            "flags": list(self.flags),
            "models": [m.as_dict() for m in self.models],
        }


@dataclass(frozen=True)
class Unreachable:
    """A peer whose view could not be had, and why."""

    api: str
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"api": self.api, "reason": self.reason}


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeView, ...]
    unreachable: tuple[Unreachable, ...] = field(default=())

    def node(self, node: str) -> NodeView | None:
        return next((n for n in self.nodes if n.node == node), None)

    def as_dict(self) -> dict[str, object]:
        return {
            "nodes": [n.as_dict() for n in self.nodes],
            "unreachable": [u.as_dict() for u in self.unreachable],
        }


# -- reading a view that came from elsewhere --------------------------------------------


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ViewError(f"{what} is not a JSON object")
    return value


def _list(value: object, what: str, top: int) -> list[object]:
    if not isinstance(value, list) or len(value) > top:
        raise ViewError(f"{what} is not a list of at most {top}")
    return value


def _text(value: object, what: str, *, optional: bool = False, limit: int = _MAX_TEXT) -> str:
    if value is None and optional:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise ViewError(f"{what} is not a string of at most {limit} characters")
    if any(not c.isprintable() for c in value):
        raise ViewError(f"{what} holds a control character")
    return value


def _number(value: object, what: str, flags: list[str], *, whole: bool) -> int | float:
    """A number as reported; a negative, huge or non-finite one is flagged, not refused."""
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ViewError(f"{what} is not {'an integer' if whole else 'a number'}")
    if isinstance(value, float) and not math.isfinite(value):
        flags.append(f"{what} is {value}")
        return 0.0
    if value < 0:
        flags.append(f"{what} is negative ({value})")
    elif value > MAX_FILE_SIZE:
        flags.append(f"{what} is implausibly large ({value})")
    return value


def _range(raw: object, what: str, size: int, flags: list[str]) -> RangeView:
    """One range of a file's view; what cannot be goes in the file's ``flags``."""
    doc = _object(raw, what)
    offset = int(_number(doc.get("offset"), "offset", flags, whole=True))
    length = int(_number(doc.get("length"), "length", flags, whole=True))
    done = int(_number(doc.get("done"), "done", flags, whole=True))
    if offset + length > size:
        flags.append(f"range [{offset}, {offset + length}) ends past the file's {size} B")
    if done > length:
        flags.append(f"range [{offset}, ...) done {done} B of {length} B")
    role = _text(doc.get("role"), f"{what}.role", limit=32)
    if role not in RANGE_ROLES:
        flags.append(f"range role {role!r} is not one of {', '.join(RANGE_ROLES)}")
    node = _text(doc.get("node"), f"{what}.node", optional=True, limit=64) or None
    return RangeView(offset, length, done, role, node)


def _file(raw: object, what: str) -> FileView:
    doc = _object(raw, what)
    flags: list[str] = []
    size = int(_number(doc.get("size"), "size", flags, whole=True))
    done = int(_number(doc.get("done"), "done", flags, whole=True))
    if size >= 0 and done > size:
        flags.append(f"done is {done / size:.0%} of the size" if size else "done is over 0 B")
    role = _text(doc.get("role"), f"{what}.role", limit=32)
    if role not in ROLES:
        flags.append(f"role {role!r} is not one of {', '.join(ROLES)}")
    follows = _text(doc.get("follows"), f"{what}.follows", optional=True, limit=64) or None
    if role == "follows" and follows is None:
        flags.append("it follows no node it names")
    raw_ranges = doc.get("ranges")
    listed = [] if raw_ranges is None else _list(raw_ranges, f"{what}.ranges", MAX_RANGES)
    ranges = tuple(_range(r, f"{what}.ranges[{i}]", size, flags) for i, r in enumerate(listed))
    return FileView(
        name=_text(doc.get("name"), f"{what}.name", limit=1024),
        size=size,
        done=done,
        role=role,
        follows=follows,
        follows_api=_text(doc.get("follows_api"), f"{what}.follows_api", optional=True, limit=300)
        or None,
        rate=float(_number(doc.get("rate"), "rate", flags, whole=False)),
        upload_rate=float(_number(doc.get("upload_rate"), "upload_rate", flags, whole=False)),
        peers=int(_number(doc.get("peers"), "peers", flags, whole=True)),
        bytes_from_origin=int(
            _number(doc.get("bytes_from_origin"), "bytes_from_origin", flags, whole=True)
        ),
        bytes_from_peers=int(
            _number(doc.get("bytes_from_peers"), "bytes_from_peers", flags, whole=True)
        ),
        flags=tuple(flags),
        ranges=ranges,
    )


def _model(raw: object, what: str) -> ModelView:
    doc = _object(raw, what)
    flags: list[str] = []
    state = _text(doc.get("state"), f"{what}.state", limit=32)
    if state not in STATES:
        flags.append(f"state {state!r} is not one of {', '.join(STATES)}")
    files = _list(doc.get("files"), f"{what}.files", MAX_FILES)
    return ModelView(
        key=_text(doc.get("key"), f"{what}.key", limit=64),
        url=_text(doc.get("url"), f"{what}.url"),
        state=state,
        files=tuple(_file(f, f"{what}.files[{i}]") for i, f in enumerate(files)),
        bytes_from_origin=int(
            _number(doc.get("bytes_from_origin"), "bytes_from_origin", flags, whole=True)
        ),
        bytes_from_peers=int(
            _number(doc.get("bytes_from_peers"), "bytes_from_peers", flags, whole=True)
        ),
        flags=tuple(flags),
    )


def parse_node(raw: object, where: str) -> NodeView:
    """A node's view as ``where`` (a peer, a daemon) sent it; see the module docstring.

    Raises:
        ViewError: it is not a view (naming ``where`` and the field).
    """
    try:
        doc = _object(raw, "the view")
        node = _text(doc.get("node"), "node", limit=64)
        if not _ID.match(node):
            raise ViewError("node is not a hex id")
        flags: list[str] = []
        when = float(_number(doc.get("time"), "time", flags, whole=False))
        models = _list(doc.get("models"), "models", MAX_MODELS)
        return NodeView(
            node=node,
            api=_text(doc.get("api"), "api", optional=True, limit=300) or None,
            swarm=_text(doc.get("swarm"), "swarm", limit=64),
            time=when,
            models=tuple(_model(m, f"models[{i}]") for i, m in enumerate(models)),
            bytes_from_origin=int(
                _number(doc.get("bytes_from_origin"), "bytes_from_origin", flags, whole=True)
            ),
            bytes_from_peers=int(
                _number(doc.get("bytes_from_peers"), "bytes_from_peers", flags, whole=True)
            ),
            download_rate=float(
                _number(doc.get("download_rate"), "download_rate", flags, whole=False)
            ),
            upload_rate=float(_number(doc.get("upload_rate"), "upload_rate", flags, whole=False)),
            banned=int(_number(doc.get("banned"), "banned", flags, whole=True)),
            flags=tuple(flags),
        )
    except ViewError as exc:
        raise ViewError(f"{where}: its view is refused: {exc}") from None


def parse_cluster(raw: object, where: str) -> ClusterView:
    """A cluster's view as the daemon at ``where`` answered it.

    Raises:
        ViewError: it is not one.
    """
    doc = _object(raw, f"{where}: the answer")
    nodes = _list(doc.get("nodes"), f"{where}: nodes", MAX_NODES)
    unreachable = []
    for i, entry in enumerate(_list(doc.get("unreachable"), f"{where}: unreachable", MAX_NODES)):
        item = _object(entry, f"{where}: unreachable[{i}]")
        api = _text(item.get("api"), f"{where}: unreachable[{i}].api", limit=300)
        unreachable.append(Unreachable(api, _text(item.get("reason"), "reason")))
    views = tuple(parse_node(n, f"{where}: nodes[{i}]") for i, n in enumerate(nodes))
    return ClusterView(views, tuple(unreachable))


def parse_one(raw: bytes, where: str) -> NodeView:
    """The one node's view a peer answers for itself (``{"nodes": [<its view>], ...}``),
    as it sent it (blocking: up to ``MAX_VIEW`` bytes decoded).

    Raises:
        ViewError: it is not JSON, or not one view.
    """
    try:
        decoded: object = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ViewError(f"{where}: its view is not JSON") from None
    doc = _object(decoded, f"{where}: the answer")
    nodes = _list(doc.get("nodes"), f"{where}: nodes", 1)
    if not nodes:
        raise ViewError(f"{where}: its answer holds no view")
    return parse_node(nodes[0], where)
