"""The registry of models the daemon holds: plain synchronous bookkeeping, no I/O.

A model moves ``queued -> downloading -> ready`` or ``-> failed``; a ready model
whose files the cache evicted (to make room for another under its size limit) is
``evicted``. Posting its URL again queues a new download of a failed or evicted
model. A failed model stays ``failed`` between its tries (see retry.py), with
the last error, how many tries failed and when the next one is. Every change
happens in one synchronous call, so a cancelled request or download can never
leave a record half updated.

The node's readiness (``readiness()`` without records, ``GET /ready``) is that of
its preloads, the models it was started to keep: a model a client added through
the API is listed as ``pending`` until it is ready, but never takes the node out
of its Service, where its pods could no longer reach the daemon at all.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from ..redact import redact
from ..sources.stores import Location, locate

__all__ = ["ModelRecord", "Registry", "Status", "display_url", "model_id_for"]

Status = Literal["queued", "downloading", "ready", "failed", "evicted"]

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_READY_FIELDS = (
    "id", "url", "status", "bytes_done", "bytes_total", "progress", "error", "error_kind",
    "failures", "next_try", "next_try_in", "priority", "preload",
)  # fmt: skip
_MODEL_FILES = (".safetensors.index.json", ".safetensors")


def display_url(url: str) -> str:
    """``url`` as the daemon shows it: user info and query values redacted (see redact.py)."""
    return redact(url)


def model_id_for(url: str) -> str:
    """A stable, readable id: the model's folder or file name and a hash of the URL."""
    path = urlsplit(url).path.rstrip("/")
    parts = [p for p in path.split("/") if p]
    name = parts[-1] if parts else urlsplit(url).netloc
    if name.endswith(_MODEL_FILES) and len(parts) > 1 and name.startswith("model"):
        name = parts[-2]  # ".../llama/model.safetensors.index.json" is "llama"
    for suffix in _MODEL_FILES:
        name = name.removesuffix(suffix)
    slug = _SLUG.sub("-", name).strip("-._")[:40] or "model"
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return f"{slug}-{digest}"


@dataclass
class ModelRecord:
    """One model: where it comes from and how far its download got.

    ``where`` is its URL as the daemon checked it (app.py's ``check_url``), the value
    the allow-list judged and its fetch reads.
    """

    id: str
    url: str
    where: Location = field(repr=False, compare=False)
    status: Status = "queued"
    bytes_done: int = 0
    bytes_total: int | None = None
    error: str | None = None
    error_kind: str | None = None
    hit: bool | None = None
    path: str | None = None
    files: tuple[str, ...] = ()
    preload: bool = False
    priority: int = 0  # higher downloads first (priority.py)
    failures: int = 0  # tries that failed in a row
    next_try: float | None = None  # when a failed preload is tried again (time.time())
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    bytes_from_origin: int | None = None  # with peers (--peers): where its bytes came from
    bytes_from_peers: int | None = None

    def as_dict(self) -> dict[str, Any]:
        total = self.bytes_total
        wait = None if self.next_try is None else max(0.0, round(self.next_try - time.time(), 3))
        return {
            "id": self.id,
            "url": display_url(self.url),
            "status": self.status,
            "bytes_done": self.bytes_done,
            "bytes_total": total,
            "progress": round(self.bytes_done / total, 4) if total else None,
            "error": self.error,
            "error_kind": self.error_kind,
            "failures": self.failures,
            "next_try": self.next_try,
            "next_try_in": wait,
            "cache_hit": self.hit,
            "path": self.path,
            "files": len(self.files),
            "preload": self.preload,
            "priority": self.priority,
            "created": self.created,
            "started": self.started,
            "finished": self.finished,
            "bytes_from_origin": self.bytes_from_origin,
            "bytes_from_peers": self.bytes_from_peers,
        }

    def reason(self) -> str:
        """Why the model is not ready, in a line (for /ready)."""
        if self.status == "failed":
            tries = "1 try" if self.failures == 1 else f"{self.failures} tries"
            why = f"failed ({tries}): {self.error}"
            if self.next_try is None:
                return f"{why}; POST its URL to /v1/models to try again"
            return f"{why}; next try in {max(0.0, self.next_try - time.time()):.1f} s"
        if self.status == "evicted":
            if self.preload:
                return "its files left the cache; fetching it again"
            return "evicted from the cache; POST its URL to /v1/models to fetch it again"
        if self.status == "downloading" and self.failures:
            return f"downloading, try {self.failures + 1} (the last failed: {self.error})"
        return self.status

    def queue(self) -> None:
        self.status = "queued"
        self.bytes_done = 0
        self.error = self.error_kind = None
        self.started = self.finished = None
        self.hit = None
        self.failures = 0
        self.next_try = None

    def start(self) -> None:
        """A try begins; a retry keeps the last error on show until it ends."""
        self.status = "downloading"
        self.started = time.time()
        self.next_try = None

    def progress(self, done: int, total: int) -> None:
        self.bytes_done = done
        self.bytes_total = total

    def succeed(self, *, nbytes: int, hit: bool, path: str | None, files: tuple[str, ...]) -> None:
        self.status = "ready"
        self.error = self.error_kind = None
        self.failures = 0
        self.next_try = None
        self.bytes_done = self.bytes_total = nbytes
        self.hit = hit
        self.path = path
        self.files = files
        self.finished = time.time()

    def fail(self, error: BaseException) -> None:
        self.status = "failed"
        # LoaderErrors are redacted already; a foreign one (aiohttp, OSError) may not be.
        self.error = redact(str(error)) or type(error).__name__
        self.error_kind = type(error).__name__
        self.finished = time.time()
        self.failures += 1

    def retry_in(self, seconds: float) -> None:
        """The failed model is tried again in ``seconds``."""
        self.next_try = time.time() + seconds


class Registry:
    """Models by id, each URL once."""

    def __init__(self) -> None:
        self._by_id: dict[str, ModelRecord] = {}
        self._by_url: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for record in self._by_id.values():
            counts[record.status] = counts.get(record.status, 0) + 1
        return f"<Registry {counts}>"

    def add(
        self,
        where: Location | str,
        model_id: str | None = None,
        *,
        preload: bool = False,
        priority: int = 0,
    ) -> ModelRecord:
        """The record of ``where``, created if new (a known one keeps its priority, and
        takes ``where``, checked again, for its next fetch); a str is located here.

        Raises:
            KeyError: ``model_id`` already names another URL.
        """
        if isinstance(where, str):
            where = locate(where)
        url = where.first
        known = self._by_url.get(url)
        if known is not None:
            record = self._by_id[known]
            record.where = where
            return record
        model_id = model_id or model_id_for(url)
        if model_id in self._by_id:
            raise KeyError(model_id)
        record = ModelRecord(id=model_id, url=url, where=where, preload=preload, priority=priority)
        self._by_id[model_id] = record
        self._by_url[url] = model_id
        return record

    def find(self, key: str) -> ModelRecord | None:
        """A record by id, or by URL."""
        record = self._by_id.get(key)
        if record is None and key in self._by_url:
            record = self._by_id[self._by_url[key]]
        return record

    def drop(self, model_id: str) -> ModelRecord | None:
        record = self._by_id.pop(model_id, None)
        if record is not None:
            self._by_url.pop(record.url, None)
        return record

    def all(self) -> list[ModelRecord]:
        return list(self._by_id.values())

    def readiness(self, records: list[ModelRecord] | None = None) -> tuple[bool, dict[str, Any]]:
        """Whether every preload (or every given model) is ready, and what is missing;
        models added through the API that are not ready yet are listed as ``pending``."""
        added: list[ModelRecord] = []
        if records is None:
            records = [r for r in self.all() if r.preload]
            added = [r for r in self.all() if not r.preload and r.status != "ready"]
        missing = [r for r in records if r.status != "ready"]
        body: dict[str, Any] = {
            "ready": not missing,
            "models": len(records),
            "models_ready": len(records) - len(missing),
            "missing": [_unready(r) for r in missing],
            "pending": [_unready(r) for r in added],
        }
        return not missing, body


def _unready(record: ModelRecord) -> dict[str, Any]:
    shown = record.as_dict()
    return {**{k: shown[k] for k in _READY_FIELDS}, "reason": record.reason()}
