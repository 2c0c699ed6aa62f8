"""The public entry points: ``load_model`` for one shot, ``Loader`` to keep resources warm."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Unpack

from .devices.auto import device_for
from .devices.base import Device
from .errors import ClosedError
from .format.safetensors import FileHeader
from .load.pipeline import Load, Progress, Selection, open_model
from .load.report import LoadReport
from .load.stack import URL, Location, SourceStack, locate
from .load.stream import StreamStatistics, TensorStream
from .reads.rows import Rows
from .reads.staging import BudgetStatistics, ByteBudget
from .redact import redact
from .runtime.resource import AsyncResource
from .runtime.threads import Lanes
from .settings.options import LoadKeywords, LoadOptions
from .settings.values import Limits
from .sources.layout import ModelLayout

__all__ = [
    "Loader",
    "LoaderStatistics",
    "wait_hf_cache",
    "ModelInfo",
    "StreamStatistics",
    "TensorStream",
    "inspect_model",
    "load_model",
    "load_model_sync",
]


def _ranks_for(group: Any, device: Device) -> Any:
    """Solo, or Group with ``group=`` (ranks.py, imported when a Loader is made)."""
    from .ranks.strategy import ranks_for

    return ranks_for(group, device)


def _display(url: URL | Location) -> str:
    """``url`` for messages, reports and task names: its secrets redacted."""
    if isinstance(url, Location):
        url = url.url
    if isinstance(url, str):
        return redact(url)
    urls = list(url)
    return redact(urls[0] if len(urls) == 1 else f"{urls[0]} and {len(urls) - 1} more files")


def _located(url: URL | Location) -> Location:
    """``url`` parsed, once: here at the API's edge unless the caller did (``locate``)."""
    return url if isinstance(url, Location) else locate(url)


@dataclass(frozen=True)
class LoaderStatistics:
    """A ``Loader``'s state at one moment.

    Attributes:
        budget: bytes staged and in flight, against the budget.
        streams: streams open.
        sources: each store's request statistics (remote stores), keyed by store.
        cache: the node cache's counters, or None without a cache.
    """

    budget: BudgetStatistics
    streams: int
    sources: dict[str, Any]
    cache: Any


@dataclass(frozen=True)
class ModelInfo:
    """What a model holds, from its headers alone (no tensor bytes read).

    Attributes:
        url: what was inspected.
        layout: its files, and the index if there was one.
        headers: one validated header per file.
    """

    url: str
    layout: ModelLayout
    headers: tuple[FileHeader, ...] = field(repr=False)

    @property
    def metadata(self) -> dict[str, str]:
        """``__metadata__`` of every file, merged in file order."""
        merged: dict[str, str] = {}
        for header in self.headers:
            merged.update(header.metadata)
        return merged


class Loader(AsyncResource):
    """A long-lived loader: keeps thread pools and budgets between loads.

    Takes a ``LoadOptions``, or its keywords one by one (all listed, with the
    environment variables that set them, in aioloader/settings/options.py):

    - ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``;
      ``framework``: ``"torch"`` tensors, ``"numpy"`` host arrays or ``"cupy"`` GPU arrays.
    - ``limits`` (a Limits), or ``concurrency``, ``chunk_size``, ``memory_limit``.
    - ``http`` (an HttpOptions), or ``headers``, ``max_attempts``, ``stall_timeout`` ...:
      retries, timeouts and extra headers of remote reads.
    - ``s3`` (an S3Options), or ``s3_endpoint_url``, ``s3_region`` ...
    - ``cache_dir``: a folder (or ModelCache) that remote files are cached in and loaded
      from while unchanged on the server; default ``$AIOLOADER_CACHE_DIR`` if set,
      ``False`` for none.
    - ``group``: a ``torch.distributed`` process group (gloo) whose ranks all load the
      same model: each reads about 1/N of the bytes and the ranks exchange the rest, so
      every rank ends with every tensor (see aioloader/ranks/strategy.py). Every rank must make
      the same calls, in the same order.

    Use as ``async with Loader() as loader:``; ``aclose()`` is idempotent and a
    closed loader refuses new work.
    """

    def __init__(
        self, options: LoadOptions | None = None, /, **keywords: Unpack[LoadKeywords]
    ) -> None:
        self.options = LoadOptions.build(options, **keywords)
        limits = self.options.limits
        assert limits is not None
        self.limits: Limits = limits
        # Every thread of this loader's loads: its sources', cache's and device's lanes,
        # started on first use, closed in aclose (threads.py).
        self._lanes = Lanes(limits.concurrency)
        self._device: Device = device_for(
            self.options.device, limits, self.options.framework, self._lanes.setup
        )
        self._ranks = _ranks_for(self.options.group, self._device)
        self._budget = ByteBudget(limits.staging_bytes)
        # What URLs are read through, per store (stack.py); closed in aclose.
        self._stack = SourceStack(self.options, self._lanes, staged=self._device.copies)
        self._streams: set[TensorStream] = set()
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        b = self._budget.statistics()
        return (
            f"<Loader {state} device={self._device.name} concurrency={self.limits.concurrency} "
            f"staging={b.used}/{b.limit}>"
        )

    @property
    def device(self) -> Device:
        """Where this loader puts tensors."""
        return self._device

    def statistics(self) -> LoaderStatistics:
        """Budget use, open streams, each store's requests and cache counters, as a snapshot."""
        cache = self._stack.cache
        return LoaderStatistics(
            budget=self._budget.statistics(),
            streams=len(self._streams),
            sources=self._stack.statistics(),
            cache=cache.statistics() if cache is not None else None,
        )

    async def __aenter__(self) -> Loader:
        self._check_open()
        return self

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this Loader is closed; create a new one")

    def stream(
        self, url: URL | Location, *, tensors: Selection = None, rows: Rows = None
    ) -> TensorStream:
        """Stream the tensors of ``url`` as each one completes.

        Args:
            url: a ``.safetensors`` file, a folder of shards or a
                ``*.safetensors.index.json``, as a local path or a URL of any scheme
                aioloader reads (sources/schemes.py); or a list of file URLs of one store;
                or a ``Location`` that ``locate`` parsed them into (they are parsed once).
            tensors: names to load, or a predicate on names; ``None`` loads all.
                Only the selected tensors' bytes are read.
            rows: load only rows ``[start, stop)`` of the first dimension of some
                tensors, reading only those bytes: ``{name: (start, stop)}``, or a
                function ``(name, shape) -> (start, stop) | None`` such as
                ``split_rows(rank, world_size)``. With ``group=``, each rank reads its
                own rows and they are not exchanged (see aioloader/reads/rows.py).

        Returns:
            A TensorStream; use it with ``async with``.
        """
        self._check_open()
        stream = TensorStream(
            _display(url),
            lambda emit, progress, meta: self._run(url, tensors, emit, progress, meta, rows),
            self._streams.discard,
        )
        self._streams.add(stream)
        return stream

    async def load(
        self, url: URL | Location, *, tensors: Selection = None, rows: Rows = None
    ) -> dict[str, Any]:
        """Load tensors of ``url`` into a dict (see ``stream`` for the arguments).

        Returns:
            ``{name: tensor}``, in the order the tensors completed.

        Raises:
            LoaderError: naming the file, tensor or byte range that failed.
        """

        async def attempt(where: Location) -> dict[str, Any]:
            got: dict[str, Any] = {}
            await self._run(where, tensors, got.__setitem__, Progress(), None, rows)
            return got

        self._check_open()
        # Nobody sees these tensors before the load returns: the stack may take it back.
        return await self._stack.load(_located(url), attempt)

    async def inspect(self, url: URL | Location) -> ModelInfo:
        """Read and validate the headers of ``url`` without reading tensor data."""
        self._check_open()
        where = _located(url)
        async with await open_model(self._stack.source(where), where.url, self._lanes) as model:
            return ModelInfo(url=_display(url), layout=model.layout, headers=tuple(model.headers))

    async def _run(
        self,
        url: URL | Location,
        selection: Selection,
        emit: Any,
        progress: Progress,
        meta: Any,
        rows: Rows = None,
    ) -> LoadReport:
        self._check_open()
        where = _located(url)
        source = self._stack.load_source(where)
        ranks = self._ranks()
        try:
            model = await open_model(source, where.url, self._lanes)
        except BaseException as exc:
            await ranks.announce_failure(exc)
            raise
        load = Load(
            url=_display(where.url),
            model=model,
            ranks=ranks,
            device=self._device,
            limits=self.limits,
            lanes=self._lanes,
            budget=self._budget,
            selection=selection,
            rows=rows,
            emit=emit,
            progress=progress,
            on_metadata=meta,
        )
        return await load.run()

    async def aclose(self) -> None:
        """Stop every stream and release threads, files and devices; idempotent."""
        if self._closed:
            return
        self._closed = True
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        try:
            await self._stack.aclose()
            await self._device.aclose()
        finally:
            # Every call into them has returned (run_blocking waits): joins at once.
            self._lanes.close()

    def __del__(self, _warn: Any = warnings.warn) -> None:
        stack = getattr(self, "_stack", None)
        if not getattr(self, "_closed", True) and stack is not None and stack.opened:
            _warn(
                f"{self!r} was never closed; use `async with Loader() as loader`",
                ResourceWarning,
                stacklevel=1,
            )


async def load_model(
    url: URL | Location,
    *,
    tensors: Selection = None,
    rows: Rows = None,
    options: LoadOptions | None = None,
    **keywords: Unpack[LoadKeywords],
) -> dict[str, Any]:
    """Load a safetensors model in one call.

    Args:
        url: a ``.safetensors`` file, ``file://`` URL, folder of shards, or
            ``*.safetensors.index.json``.
        tensors: names to load, or a predicate on names; ``None`` loads all.
        rows: only these rows of the first dimension of some tensors (see ``Loader.stream``).
        options, keywords: what ``Loader`` takes (device, concurrency, headers, cache_dir,
            group ...: see aioloader/settings/options.py).

    Returns:
        ``{name: torch.Tensor}``, bit-identical to ``safetensors.torch.load_file``.

    Raises:
        LoaderError: naming the URL, file, tensor or byte range and what to do.
    """
    async with Loader(options, **keywords) as loader:
        return await loader.load(url, tensors=tensors, rows=rows)


def load_model_sync(
    url: URL | Location,
    *,
    tensors: Selection = None,
    rows: Rows = None,
    options: LoadOptions | None = None,
    **keywords: Unpack[LoadKeywords],
) -> dict[str, Any]:
    """``load_model`` for code that is not async: runs the load on an event loop of its own.

    Safe from plain scripts and from any thread without a running loop, several at
    once (each call has its own loop and Loader). Ctrl-C cancels the load, closes what
    it opened and raises KeyboardInterrupt.

    Raises:
        EventLoopError: called on the thread of a running event loop, which it would
            block; ``await load_model(...)`` there, or call this from another thread.
        LoaderError: as ``load_model``.
    """
    from .runtime.sync import run

    # Made before the loop starts (sync.py): bad options fail without one.
    return run(
        lambda: load_model(
            url, tensors=tensors, rows=rows, options=LoadOptions.build(options, **keywords)
        ),
        caller="load_model_sync()",
        instead="use `await aioloader.load_model(...)` there, or call load_model_sync from "
        "another thread (e.g. `await asyncio.to_thread(...)`)",
    )


async def inspect_model(url: URL | Location) -> ModelInfo:
    """Read the headers of a model (no tensor data): tensors, dtypes, metadata."""
    async with Loader() as loader:
        return await loader.inspect(url)


async def wait_hf_cache(root: str | os.PathLike[str] | None = None) -> None:
    """Wait for the Hugging Face cache writes that ``hf://`` loads in this process left
    running after they returned (under ``root``; default the cache in use now).

    A process that exits normally waits for them itself; call this to know the cache is
    complete, e.g. before starting another tool on it offline.
    """
    from .sinks.hf.cache_writes import wait_hf_cache as wait

    await wait(None if root is None else os.fspath(root))
