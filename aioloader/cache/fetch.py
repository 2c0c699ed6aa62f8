"""Downloading the missing byte ranges of a model's files into their cache entries
(``fetch_model``, what ``ModelCache.fetch`` runs), then linking them under ``models/``.

Every acquire has its release in the same ``try``/``finally``, and a lock or a
partial file that a thread opened after its caller was cancelled is closed
again (``run_blocking``'s ``on_abandon``): a cancelled fetch (the daemon's
DELETE, SIGTERM) leaves no lock held and no descriptor open.

A fetch started while ``PACE`` holds a ``Pace`` (pace.py: the daemon's bandwidth
cap) cuts its range reads to the pace's ``quantum``; the HTTP sources take each
request's bytes from it before sending the request, the probes that open the
files included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from contextlib import contextmanager, nullcontext
from typing import Any

from ..errors import CacheError, ConfigError, DigestMismatchError, LoaderError
from ..reads.ranges import split
from ..redact import redacting_logger
from ..runtime.pace import PACE, Pace
from ..runtime.tasks import gather
from ..runtime.threads import run_blocking
from ..runtime.turns import Turns
from ..settings.options import LoadOptions
from ..settings.values import Limits
from ..sources.base import Blob, Source, aclose_all
from ..sources.layout import resolve_layout
from ..sources.schemes import listed
from ..sources.stores import Location, Stores
from .checksum import DigestMismatch, Published, md5_of_etag
from .claim import Claim, claim
from .entry import EntryFiles, Version, cache_error, key_of, version_of
from .links import ModelLinks
from .locks import acquire
from .partial import PartialFile
from .protocol import CacheProtocol
from .records import CachedModel
from .supply import Arrival, Delivery, Supply, Supplying

__all__ = ["PACE", "Pace", "Progress", "Supply", "fetch_model"]

logger = redacting_logger(__name__)

Progress = Callable[[int, int], None]


def _etag_is_not_a_digest(headers: Mapping[str, str]) -> bool:
    """Whether S3 encrypted the object with SSE-KMS or SSE-C: its ETag then looks like
    an MD5 but is not one of the bytes (SSE-S3 keeps MD5 ETags)."""
    kms = headers.get("x-amz-server-side-encryption", "").lower().startswith("aws:kms")
    return kms or "x-amz-server-side-encryption-customer-algorithm" in headers


class Meter:
    """Bytes done across the files of one fetch, reported to a callback."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.done = 0
        self.total = 0

    def add(self, n: int) -> None:
        self.done += n
        if self.callback is not None and n:
            self.callback(self.done, self.total)


class Fetcher:
    """Downloads the missing ranges of a set of files, ``concurrency`` ranges at once."""

    def __init__(
        self,
        cache: CacheProtocol,
        source: Source,
        executor: Executor,
        limits: Limits,
        meter: Meter,
        exclude: set[str],
        supply: Supply,
    ) -> None:
        self.cache = cache
        self.supply = supply  # where files come from other than the origin (supply.py)
        self.exclude = exclude  # the entries of this fetch: never evicted to make room
        self.source = source
        self.executor = executor
        pace = PACE.get()
        self.piece = limits.chunk_size
        if pace is not None:
            self.piece = min(self.piece, pace.quantum)  # the source takes from it
        self.limiter = Turns(limits.concurrency)  # by (file, offset): files complete in order
        self.meter = meter
        self.free: list[bytearray] = []

    async def run(self, urls: list[str]) -> dict[str, tuple[int, int]]:
        """Every file complete; returns url -> (size, bytes downloaded)."""
        blobs: dict[str, Blob] = {}
        results: dict[str, tuple[int, int]] = {}
        detours: list[LoaderError] = []

        async def one(place: int, url: str) -> None:
            # Each file goes on once it is open, not once every file is: a file another
            # node lists only once it has a file from this one (a swarm) must not wait
            # for this node's other files.
            try:
                delivery = await self.supply.delivery(url, self.source, self.executor)
                async with self.limiter.turn((-1, 0)):
                    if delivery is not None:
                        blob = blobs[url] = delivery.blob
                    else:
                        opened = await self.source.open(url)
                        blob = blobs[url] = self.supply.from_origin(opened)
                self.meter.total += blob.size
                results[url] = (blob.size, await self._file(blob, delivery, place))
            except LoaderError as exc:
                if not self.supply.detour(exc):
                    raise
                detours.append(exc)  # the others finish first (their reads are not lost)

        self.supply.expect(urls)
        try:
            await gather(one(i, u) for i, u in enumerate(urls))
        finally:
            await aclose_all(blobs.values())
        if detours:
            raise detours[0]
        return results

    async def _blocking(
        self,
        fn: Callable[[], Any],
        url: str,
        doing: str,
        on_abandon: Callable[[Any], object] | None = None,
    ) -> Any:
        try:
            return await run_blocking(self.executor, fn, on_abandon)
        except OSError as exc:
            raise cache_error(exc, self.cache.root, f"{doing} {url}") from exc

    @contextmanager
    def _landed(self, url: str) -> Iterator[None]:
        """A delivery's ``OSError`` (its writer could not write this cache's file: a full
        disk, a size limit) is this cache's error for ``url``, nobody else's."""
        try:
            yield
        except LoaderError:
            raise  # a source's or a supply's (a TimeoutError among them)
        except OSError as exc:
            raise cache_error(exc, self.cache.root, f"writing {url}") from exc

    async def _file(self, blob: Blob, delivery: Delivery | None, place: int) -> int:
        """Make one file complete (``place``: its turn among the fetch's files; its
        ``delivery``: how it comes where not read from the origin); returns the bytes
        downloaded."""
        cache, url = self.cache, blob.url
        version = version_of(blob)
        files = cache.entry_files(url)
        if not version.verifiable:
            logger.warning(
                "%s: the server sends neither ETag nor Last-Modified, so a cached copy cannot "
                "be checked and is downloaded again", url,
            )  # fmt: skip
        while True:
            meta = await self._blocking(lambda: files.complete_for(version), url, "checking")
            if meta is not None and await self._touch(files, version):
                cache.record(hit=True)
                self.meter.add(version.size)
                return 0
            try:
                held = await claim(
                    files, version, self.executor, by="fetch", stall=cache.lock_stall, url=url
                )
            except OSError as exc:
                raise cache_error(exc, cache.root, f"locking {url}") from exc
            if isinstance(held, Claim):
                lock = held
                break
            # Another process completed it while this one waited: use that copy.
        try:
            await cache.eviction.make_room(files, version.size, self.exclude, self.executor)
            published = await self._published(url, version)
            # A download an earlier run left is checked whole against the publisher's
            # digest at its end: its source sees only the bytes it reads now.
            left = await self._blocking(lambda: files.journal.exists(), url, "checking")
            digest = await self.source.publisher_digest(url) if left else None
            partial: PartialFile = await self._blocking(
                lambda: PartialFile.open(
                    files, url, version, published=published, digest=digest
                ),
                url, "preparing", on_abandon=PartialFile.close,
            )  # fmt: skip
            partial.heartbeat = lock.beat
            try:
                self.meter.add(partial.done.total)
                missing = split(partial.done.missing(version.size), self.piece)
                downloaded = sum(end - start for start, end in missing)
                # A resumed file is read and written as ever: its bytes are in it already.
                lands = (
                    delivery.landing(files.partial)
                    if delivery is not None and not partial.done
                    else nullcontext()
                )
                async with lands as landing:
                    try:
                        await self._fill(blob, delivery, landing, partial, place, missing)
                    except DigestMismatchError:  # refused by its source: keep none of it
                        await self._blocking(partial.files.discard, url, "discarding")
                        raise
                    await self._complete(partial, url, version, published)
            finally:
                partial.close()
        finally:
            lock.release()
        cache.record(hit=False, downloaded=downloaded)
        await self.supply.committed(url, files.data, version)
        return downloaded

    async def _published(self, url: str, version: Version) -> Published | None:
        """The digest of the whole object the server publishes, if any: S3's checksum of
        an object uploaded with one, else an ETag that is an MD5 where the source's ETags
        are (S3's; a plain HTTP server's 32 hex digits are its own business)."""
        checksums = await self.source.object_checksums(url)
        for algorithm in ("sha256", "sha1", "crc32"):
            header = f"x-amz-checksum-{algorithm}"
            if header in checksums:
                return Published(algorithm, checksums[header], header)
        if not (self.source.etag_is_md5 and self.cache.check_etag):
            return None
        if _etag_is_not_a_digest(checksums):
            return None
        return md5_of_etag(version.etag)

    async def _complete(
        self, partial: PartialFile, url: str, version: Version, published: Published | None
    ) -> None:
        try:
            await self._blocking(partial.complete, url, "completing")
            if published is not None:
                logger.info(
                    "%s: the download matches the %s of the server's %s",
                    url, published.algorithm, published.where,
                )  # fmt: skip
        except DigestMismatch as exc:
            await self._blocking(partial.files.discard, url, "discarding")
            published = exc.published
            hint = (
                " Or the ETag is not an MD5 of the bytes (S3 objects encrypted with SSE-KMS "
                "or SSE-C, an S3-compatible store whose ETags only look like MD5s): fetch "
                "those with ModelCache(..., check_etag=False) or AIOLOADER_CHECK_ETAG=0 "
                "(the daemon)."
                if published.where == "ETag"
                else ""
            )
            how = "corrupted on the way"
            if partial.resumed:
                how = (
                    "resumed from a partial download an earlier run left, and its bytes "
                    "changed on disk since, or were corrupted on the way"
                )
            raise CacheError(
                f"{url}: the downloaded bytes have {published.algorithm} {exc.actual}, but the "
                f"server publishes {published.value} ({published.where}); the download was "
                f"discarded. The bytes were {how}: fetch again.{hint}"
            ) from None

    async def _touch(self, files: EntryFiles, version: Version) -> bool:
        """Mark a complete entry used now; False when it vanished meanwhile."""
        use = await acquire(
            files.use, exclusive=False, executor=self.executor, stall=self.cache.lock_stall
        )
        try:

            def touch() -> bool:
                meta = files.complete_for(version)
                if meta is not None:
                    files.touch(meta)
                return meta is not None

            return bool(await self._blocking(touch, str(files.dir), "updating"))
        finally:
            use.release()

    async def _copy(
        self,
        blob: Blob,
        delivery: Delivery | None,
        partial: PartialFile,
        key: tuple[int, int],
        end: int,
    ) -> None:
        """Copy bytes ``[start, end)`` of ``blob`` into ``partial``; ``key``: (the
        file's place, ``start``), the order the read slots go in."""
        start = key[1]
        if delivery is not None:  # bytes on their way wait without a slot
            with self._landed(blob.url):
                await delivery.ready(start, end)
        async with self.limiter.turn(key):
            buffer = self.free.pop() if self.free else bytearray(self.piece)
            try:
                view = memoryview(buffer)[: end - start]
                await blob.read_into(start, [view])
                await self._blocking(lambda: partial.write(start, [view]), blob.url, "writing")
            finally:
                self.free.append(buffer)
        self.meter.add(end - start)

    async def _fill(
        self,
        blob: Blob,
        delivery: Delivery | None,
        landing: Arrival | None,
        partial: PartialFile,
        place: int,
        missing: list[tuple[int, int]],
    ) -> None:
        """Bring the ``missing`` ranges into ``partial``: copied from ``blob``, or taken
        as its delivery's ``landing`` wrote them there."""
        if landing is None:
            await gather(self._copy(blob, delivery, partial, (place, s), e) for s, e in missing)
        else:
            await gather(self._land(landing, partial, blob.url, s, e) for s, e in missing)
            with self._landed(blob.url):
                await landing.verified()

    async def _land(
        self, landing: Arrival, partial: PartialFile, url: str, start: int, end: int
    ) -> None:
        """Take bytes ``[start, end)`` into ``partial`` once its blob wrote them there."""
        with self._landed(url):
            await landing.arrived(start, end)
        await self._blocking(lambda: partial.adopt(start, end), url, "writing")
        self.meter.add(end - start)


async def fetch_model(
    cache: CacheProtocol,
    where: Location,
    options: LoadOptions,
    progress: Progress | None,
    supply: Supply | None = None,
) -> CachedModel:
    """Make every file of the model at ``where`` (its URL, parsed once by the caller)
    complete in ``cache``; see ``ModelCache.fetch``."""
    if not where.scheme.remote:
        raise ConfigError(
            f"{where.first} is not remote; the cache holds {listed(remote=True)} files only "
            "(load local files directly)"
        )
    url = where.url if isinstance(where.url, str) else list(where.url)
    limits = options.limits
    assert limits is not None
    # A fetch owns its threads and sources (the daemon fetches without a Loader); it
    # reads the store itself, with no cache around it.
    stores = Stores(options)
    source = stores.source(where)
    executor = stores.lanes.cache
    supply = Supply() if supply is None else supply
    try:
        layout = await resolve_layout(Supplying(source, supply, executor), url)
        # Every name is checked before a byte is downloaded.
        links = ModelLinks.plan(url, layout, source.parent)
        wanted = ([layout.index] if layout.index else []) + list(layout.files)
        exclude = {key_of(u) for u in wanted}
        fetcher = Fetcher(cache, source, executor, limits, Meter(progress), exclude, supply)
        results = await fetcher.run(wanted)
        try:
            model_path = await run_blocking(executor, lambda: links.create(cache.root))
        except OSError as exc:
            raise cache_error(exc, cache.root, f"linking the files of {where.first}") from exc
        await cache.eviction.after_fetch(exclude, executor)
    finally:
        try:
            await supply.aclose()  # before the origin it reads closes
        finally:
            await stores.aclose()
    downloaded = sum(d for _, d in results.values())
    return CachedModel(
        url=where.first,
        path=model_path,
        files={u: str(cache.entry_files(u).data) for u in wanted},
        bytes=sum(size for size, _ in results.values()),
        hit=downloaded == 0,
        downloaded=downloaded,
        _entries=tuple(cache.entry_files(u) for u in wanted),
    )
