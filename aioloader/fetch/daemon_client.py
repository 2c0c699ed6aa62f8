"""``aioloader fetch --daemon URL``: the node's daemon downloads the model, fetch copies it.

A download job on a node with an ``aioloader serve`` daemon should not fetch the model
from its origin itself: the daemon holds the node's cache (and, with peers, brings the
model from the other nodes), so that a node needs one download whatever the number of
jobs, and a cluster about one. The flow:

1. ``POST /v1/models {"url": SRC}`` with the daemon's bearer token: the daemon queues
   the model, or answers with the record it holds (two fetches of one model share it);
2. ``GET /v1/models/{id}`` until ``ready``; ``failed`` fails the fetch with the daemon's
   error (a job is tried again by its own policy: a Job's backoffLimit). A record that
   says the same (status, bytes done) for ``daemon_wait`` seconds fails it too, naming
   what it last said; a daemon that restarted meanwhile (404, or not answering for a
   while) is asked again within that bound;
3. every file fetch copies is read from the daemon's cache over its API
   (``GET /v1/models/{id}/files/{key}``, key: the cache entry's name of the file's URL),
   so the job needs no mount of the node's cache. A file the daemon does not hold (404:
   config and tokenizer files, which its cache does not keep; a weight its cache evicted
   since) is read from the origin by fetch itself, as without a daemon.

Every answer is checked before it is used: a daemon that lies (a record of the wrong
shape, a body too large, a file of another size or ETag than the origin's, or one it
sends no checksum of) fails the fetch or sends it to the origin, never into DEST. The
bytes of a file copied from the daemon are hashed before DEST is committed
(folder_copy.py): they must match the checksum the daemon's cache recorded when it
downloaded them (``X-Aioloader-Checksum``, daemon/files.py), and the digest the origin
publishes where it publishes one (the Hub's sha256, S3's full-object checksum). A
mismatch fails the fetch, naming the daemon and the file: its cache holds a corrupt
copy (``aioloader cache verify`` on the node removes it), and the next fetch must not
copy it again.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import quote

import aiohttp

from ..cache.entry import key_of
from ..daemon.files import CHECKSUM_HEADER, ETAG_HEADER
from ..errors import ConfigError, SourceError
from ..redact import redact, redacting_logger
from .daemon_flags import check_daemon_url, check_daemon_wait

__all__ = [
    "CHECKSUM_HEADER",
    "ETAG_HEADER",
    "DaemonClient",
    "DaemonRecord",
    "printer",
]

logger = redacting_logger(__name__)

_MAX_ANSWER = 1 << 20  # a record is a few hundred bytes; a larger answer is no daemon's
_STATUSES = ("queued", "downloading", "ready", "failed", "evicted")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_CHUNK = 1 << 20
_POLL = (0.05, 1.0)  # first and longest pause between two reads of the record
_SHOW_EVERY = 10.0  # seconds between two progress lines of one status
_CHECKSUM = re.compile(r"^xxh3-128:[0-9a-f]{32}$")

Write = Callable[[memoryview, int], Awaitable[None]]


def printer(out: TextIO) -> Callable[[DaemonRecord], None]:
    """A progress callback writing a line to ``out`` when the daemon's status changes,
    and every few seconds while it holds (a job's log shows the download moving)."""
    shown: list[Any] = [None, 0.0]

    def show(record: DaemonRecord) -> None:
        now = time.monotonic()
        if record.status != shown[0] or now - shown[1] >= _SHOW_EVERY:
            shown[:] = [record.status, now]
            print(f"aioloader fetch: the daemon's copy is {record.describe()}", file=out)

    return show


@dataclass(frozen=True)
class DaemonRecord:
    """What the daemon says of the model: checked fields of its ``/v1/models`` record."""

    id: str
    status: str
    bytes_done: int
    bytes_total: int | None
    error: str | None

    @classmethod
    def parse(cls, body: Any, daemon: str) -> DaemonRecord:
        def bad(why: str) -> SourceError:
            return SourceError(
                f"the daemon at {daemon} answered a model record that {why}; is it an "
                "aioloader daemon of this version? Check the URL and its version"
            )

        if not isinstance(body, dict):
            raise bad("is not a JSON object")
        model_id, status = body.get("id"), body.get("status")
        if not isinstance(model_id, str) or not _ID.match(model_id):
            raise bad(f"has no valid id ({model_id!r:.80})")
        if status not in _STATUSES:
            raise bad(f"has an unknown status ({status!r:.80})")
        done, total = body.get("bytes_done"), body.get("bytes_total")
        if type(done) is not int or done < 0:
            raise bad(f"has a bad bytes_done ({done!r:.80})")
        if total is not None and (type(total) is not int or total < 0):
            raise bad(f"has a bad bytes_total ({total!r:.80})")
        error = body.get("error")
        error = None if error is None else redact(str(error))[:2000]
        return cls(model_id, status, done, total, error)

    def describe(self) -> str:
        if self.bytes_total:
            share = f" {self.bytes_done / self.bytes_total:.0%} ({self.bytes_done} of "
            return f"{self.status}{share}{self.bytes_total} bytes)"
        return self.status


class DaemonClient:
    """Talks to one daemon; use as ``async with DaemonClient(url, token, wait):``."""

    def __init__(self, url: str, token: str | None, wait: float) -> None:
        self.url = check_daemon_url(url)
        self.wait = check_daemon_wait(wait)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DaemonClient:
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=60)
        self._session = aiohttp.ClientSession(timeout=timeout, headers=self._headers)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use DaemonClient in an async with"
        return self._session

    # -- the model ---------------------------------------------------------------------

    async def ready(self, src: str, progress: Callable[[DaemonRecord], None]) -> DaemonRecord:
        """Ask the daemon for ``src`` and wait until it is in its cache (see the module)."""
        first = await self._ask(src)
        model_id = first.id
        record: DaemonRecord | None = first
        last: tuple[Any, ...] | None = None
        since = time.monotonic()
        pause = _POLL[0]
        while True:
            if record is not None:
                if record.status == "ready":
                    progress(record)
                    return record
                if record.status == "failed":  # the daemon may try again: the job does too
                    raise SourceError(
                        f"the daemon at {self.url} could not fetch {redact(src)}: "
                        f"{record.error}; fix that (its log says more), then fetch again"
                    )
                mark = (record.status, record.bytes_done, record.error)
                if mark != last:
                    last, since = mark, time.monotonic()
                    progress(record)
            if time.monotonic() - since > self.wait:
                said = record.describe() if record is not None else "nothing (not answering)"
                raise SourceError(
                    f"the daemon at {self.url} made no progress on {redact(src)} for "
                    f"{self.wait:g} s (it last said: {said}); check its log, or give it "
                    "longer with --daemon-wait / AIOLOADER_DAEMON_WAIT"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL[1])
            if record is not None and record.status == "evicted":
                record = await self._ask(src)  # its files left the cache: fetch them again
            else:
                record = await self._poll(src, model_id)
            model_id = record.id if record is not None else model_id

    async def _ask(self, src: str) -> DaemonRecord:
        status, body = await self._call("POST", "/v1/models", {"url": src})
        if status in (200, 202):
            return DaemonRecord.parse(body, self.url)
        detail = _detail(body)
        if 400 <= status < 500:
            raise ConfigError(
                f"the daemon at {self.url} refused {redact(src)} ({status}): {detail}"
            )
        raise SourceError(
            f"the daemon at {self.url} failed on POST /v1/models ({status}): {detail}; "
            "check its log"
        )

    async def _poll(self, src: str, model_id: str) -> DaemonRecord | None:
        """The record now; None while the daemon does not answer (it may be restarting)."""
        try:
            status, body = await self._call("GET", f"/v1/models/{quote(model_id)}")
        except (aiohttp.ClientError, OSError) as exc:
            logger.info("the daemon at %s does not answer (%s); asking again", self.url, exc)
            return None
        if status == 404:  # a daemon that restarted forgot the models added through its API
            return await self._ask(src)
        if status != 200:
            raise SourceError(
                f"the daemon at {self.url} failed on GET /v1/models/{model_id} ({status}): "
                f"{_detail(body)}; check its log"
            )
        return DaemonRecord.parse(body, self.url)

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request: (status, parsed JSON or None); 401 and no answer are errors."""
        try:
            async with self.session.request(method, self.url + path, json=body) as answer:
                raw = b""
                while len(raw) <= _MAX_ANSWER and (more := await answer.content.read(1 << 16)):
                    raw += more
                status = answer.status
        except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
            if method == "GET":
                raise
            raise SourceError(
                f"the daemon at {self.url} cannot be reached ({str(exc) or type(exc).__name__}): "
                "is `aioloader serve` running on this node, on that address and port?"
            ) from None
        if status == 401:
            raise ConfigError(
                f"the daemon at {self.url} refused the token (401): give its token with "
                "--token or AIOLOADER_TOKEN (the Secret its DaemonSet reads)"
            )
        if len(raw) > _MAX_ANSWER:
            raise SourceError(
                f"the daemon at {self.url} answered {method} {path} with more than "
                f"{_MAX_ANSWER} bytes; that is no aioloader daemon: check the URL"
            )
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw[:200].decode(errors="replace")

    # -- its files ---------------------------------------------------------------------

    async def copy_file(
        self, model_id: str, url: str, size: int, etag: str | None, write: Write
    ) -> str | None:
        """Write the daemon's cached copy of ``url`` (``size`` bytes and ``etag``, as the
        origin says) through ``write(data, offset)``, and return the checksum its cache
        recorded of those bytes (``xxh3-128:<hex>``), which the caller checks them
        against. None when the daemon does not hold it, holds another version (another
        size or ETag), or sends no checksum to check its copy by: the caller then reads
        the origin."""
        path = f"/v1/models/{quote(model_id)}/files/{key_of(url)}"
        try:
            async with self.session.get(self.url + path) as answer:
                if answer.status == 404:
                    return None
                if answer.status != 200:
                    raise SourceError(
                        f"the daemon at {self.url} failed to send its copy of {redact(url)} "
                        f"({answer.status}); check its log, then fetch again"
                    )
                held = answer.headers.get(ETAG_HEADER)
                if answer.content_length != size or (held and etag and held != etag):
                    logger.warning(
                        "the daemon at %s holds %s bytes of %s (ETag %s), the origin %d (ETag "
                        "%s): another version, reading the origin", self.url,
                        answer.content_length, url, held, size, etag,
                    )  # fmt: skip
                    return None
                checksum = answer.headers.get(CHECKSUM_HEADER, "")
                if not _CHECKSUM.match(checksum):
                    logger.warning(
                        "the daemon at %s sent no checksum of its copy of %s (%r; an older "
                        "aioloader?), so its bytes cannot be checked: reading the origin",
                        self.url, url, checksum[:80],
                    )  # fmt: skip
                    return None
                offset = 0
                async for chunk in answer.content.iter_chunked(_CHUNK):
                    if offset + len(chunk) > size:
                        break
                    await write(memoryview(chunk), offset)
                    offset += len(chunk)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise SourceError(
                f"the daemon at {self.url} stopped sending {redact(url)} "
                f"({str(exc) or type(exc).__name__}); fetch again"
            ) from None
        if offset != size:
            raise SourceError(
                f"the daemon at {self.url} sent {offset} bytes of {redact(url)}, not the "
                f"{size} it announced; fetch again (check its log)"
            )
        return checksum


def _detail(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return redact(body["detail"])[:500]
    return redact(str(body))[:200] if body else "no detail"
