"""vLLM integration: ``vllm serve MODEL --load-format aioloader``.

vLLM calls ``register`` once in every process it starts (the entry point
``aioloader`` of the group ``vllm.general_plugins``, declared in this package's
metadata). It registers ``AioloaderModelLoader`` under the load format
``aioloader``; nothing else happens until vLLM asks for that format.

``--model`` stays what vLLM needs for the config and tokenizer. The weights come
from ``--model-loader-extra-config``'s ``url`` (any URL a load takes), else from
the model (``model_weights`` where vLLM sets it): a local folder is read as such,
a URL (``hf://``, ``s3://``, ...) as it is, and a Hub repository id ``org/name``
that is no local folder is streamed from the Hub as ``hf://org/name@revision``
(vLLM itself fetches only the config and tokenizer, through huggingface_hub,
which honours ``HF_ENDPOINT`` as the stream does). An ``s3://``, ``gs://`` or
``az://`` model is taken as ``--load-format runai_streamer`` takes it: vLLM fetches
its config and tokenizer into a local folder, with runai's streamer and its
package for the scheme, and keeps the URL as ``model_weights``, which is
streamed; an error of that fetch gets a note naming the path and what to check
(the two patches of vLLM this takes are vllm_patches.py's). The keys are ``KEYS``;
an unknown one fails at once, naming it.

How the weights meet the model: vLLM's worker is synchronous and may own an event
loop already, so the load (and the cache fill of ``download_model``) runs on an
event loop of its own, in a thread (sync.py). Tensors
reach ``model.load_weights`` through a generator as they complete, so loading and
weight placement overlap. The files are loaded one after another, at most
``WINDOW`` of them held at once: the model's parameters already hold the
weights' memory, and a whole second copy of a large checkpoint would not fit
beside them (in GPU memory above all). On a GPU the tensors land in device
memory through this package's GPU path and are copied once more, on the
device, into the parameters.

With ``"distributed": true`` the ranks of vLLM's tensor-parallel group (on every
node it spans) load together through ``group=`` (distributed.py): each reads about
1/N of the checkpoint and receives the rest from the others over the group's gloo
(CPU) group, which vLLM creates beside its device group. The exchange is in host
memory, so the tensors then reach a GPU model through ``load_weights``' own copy.
Not the world group: with data parallelism it spans every replica, and replicas
start and load on their own, so a load waiting for all of them could hang. Each
pipeline stage's ranks are a tensor-parallel group of their own, and load together;
with one rank in the group the key changes nothing.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .redact import redacting_logger
from .runtime.sync import LoopThread, run_beside
from .settings.options import KEYWORDS, LoadOptions

if TYPE_CHECKING:
    from .sources.hf.url import HfLocation
    from .sources.stores import Location

__all__ = [
    "KEYS",
    "WINDOW",
    "VllmOptions",
    "fill_cache",
    "register",
    "stream_weights",
    "weights_url",
]

# Under "vllm", not this module's name: vLLM gives its own loggers a handler (and stops
# their propagation), so a plugin's lines show in `vllm serve` output only there.
logger = redacting_logger("vllm.aioloader")

LOAD_FORMAT = "aioloader"
WINDOW = 2  # files whose tensors may be held at once

# key -> (type or types accepted, what it is): a load's keywords (options.py) but where
# the tensors go, which vLLM decides, and the two keys of this plugin's own.
KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "url": ((str,), "where the weights are: a path or URL (http(s), s3, gs, az, hf)"),
    **{k.name: (k.types, k.help) for k in KEYWORDS if k.name not in ("device", "framework")},
    "distributed": ((bool,), "each of vLLM's ranks reads 1/N, the ranks exchange the rest"),
}


@dataclass(frozen=True)
class VllmOptions:
    """``--model-loader-extra-config``, checked."""

    url: str | None = None
    loader: LoadOptions = field(default_factory=LoadOptions)  # what the Loader takes
    distributed: bool = False

    @classmethod
    def parse(cls, extra: Mapping[str, Any] | None) -> VllmOptions:
        """Check every key and value as the Loader will, each through the load options'
        own checks (options.py, config.py); raise ConfigError naming the first bad one."""
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(KEYS))
        if unknown:
            valid = ", ".join(sorted(KEYS))
            close = difflib.get_close_matches(unknown[0], KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"--model-loader-extra-config: unknown key {', '.join(map(repr, unknown))}{hint} "
                f"for --load-format {LOAD_FORMAT}; the valid keys are: {valid}"
            )
        for key, value in extra.items():
            types, what = KEYS[key]
            wrong_bool = isinstance(value, bool) and bool not in types
            if not isinstance(value, types) or wrong_bool:
                names = " or ".join(t.__name__ for t in types)
                raise ConfigError(
                    f"--model-loader-extra-config: {key!r} must be {names} ({what}), not {value!r}"
                )
            if key == "url" and not str(value).strip():
                raise ConfigError(
                    "--model-loader-extra-config: 'url' is empty; name the weights' path or "
                    "URL, or leave the key out to load those of --model"
                )
            if key not in ("url", "distributed"):  # NaN, 0 timeouts, "" folders, ...
                try:
                    LoadOptions.build(None, environ={}, **{key: value})
                except ConfigError as exc:
                    raise ConfigError(f"--model-loader-extra-config: {key!r}: {exc}") from None
        loader = LoadOptions.build(
            **{k: v for k, v in extra.items() if k not in ("url", "distributed")}
        )
        return cls(url=extra.get("url"), loader=loader, distributed=extra.get("distributed", False))


_ENDED = object()


def stream_weights(
    url: str | Location, *, device: str = "cpu", window: int = WINDOW, **loader: Any
) -> Iterator[tuple[str, Any]]:
    """The tensors of ``url`` as ``(name, tensor)``, for synchronous code.

    The load runs on its own event loop in a thread (sync.LoopThread), from any
    thread, one with a running loop included; the files are loaded in order,
    ``window`` at most held at once (a file's tensors count as held until the
    caller has asked for the tensor after its last). Closing the generator early
    cancels the load. ``loader`` holds ``Loader``'s keyword arguments (and
    ``options=``, a LoadOptions).

    Raises:
        LoaderError: as the load raised it, naming the file, tensor or range.
    """
    results: queue.Queue[Any] = queue.Queue()
    free: list[asyncio.Semaphore] = []

    async def produce() -> None:
        from .api import Loader

        free.append(asyncio.Semaphore(window))
        options = loader.pop("options", None)
        async with Loader(options, device=device, **loader) as source:
            info = await source.inspect(url)
            for file in info.layout.files:
                await free[0].acquire()
                async with source.stream(file) as stream:
                    async for name, tensor in stream:
                        results.put((name, tensor))
                    results.put(("", stream.report))  # a file is done: its report

    producer = LoopThread(produce, name="vllm", on_exit=lambda: results.put(_ENDED))
    reports = []
    try:
        while True:
            item = results.get()
            if item is _ENDED:
                producer.result()  # the load's error, raised here
                break
            name, tensor = item
            if not name:
                reports.append(tensor)
                producer.call_soon(free[0].release)
                continue
            yield name, tensor
    finally:
        producer.cancel()
        producer.join()
    for report in reports:
        logger.info("aioloader: %s", report.summary())


def fill_cache(options: VllmOptions, url: str | Location) -> None:
    """Fill the node cache with ``url``'s files ahead of the load, when one is configured
    (``download_model``); from any thread, one with a running loop included (sync.py)."""
    cache_dir = options.loader.cache_dir
    if not cache_dir:
        return
    from .sources.stores import locate

    where = locate(url) if isinstance(url, str) else url
    if where.scheme.remote:
        from .cache.model_cache import ModelCache

        cache = cache_dir if isinstance(cache_dir, ModelCache) else ModelCache(cache_dir)
        run_beside(lambda: cache.fetch(where, options=options.loader))


# -- the vLLM side -----------------------------------------------------------------------

_registered = False
_lock = threading.Lock()


def register() -> None:
    """vLLM's plugin hook: make ``--load-format aioloader`` known (idempotent, cheap)."""
    global _registered
    with _lock:
        if _registered:
            return
        from vllm.model_executor.model_loader import register_model_loader

        from .vllm_patches import explain_object_storage_fetch, let_object_storage_through

        register_model_loader(LOAD_FORMAT)(_loader_class())
        let_object_storage_through(LOAD_FORMAT)
        explain_object_storage_fetch()
        _registered = True


def _loader_class() -> type:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class AioloaderModelLoader(BaseModelLoader):  # type: ignore[misc]
        """Loads the weights with aioloader (see the module docstring)."""

        def __init__(self, load_config: Any) -> None:
            super().__init__(load_config)
            self.options = VllmOptions.parse(load_config.model_loader_extra_config)

        def download_model(self, model_config: Any) -> None:
            """Fill the node cache ahead of the load, when one is configured."""
            fill_cache(self.options, _weights(self.options, model_config))

        def load_weights(self, model: Any, model_config: Any) -> None:
            where = _weights(self.options, model_config)
            url = where.first
            group = _load_group() if self.options.distributed else None
            # group= exchanges host memory; the model's own load_weights moves it on.
            device = "cpu" if group is not None else _device_of(model)
            expected = {name for name, _ in model.named_parameters()}
            started = time.perf_counter()
            weights = stream_weights(where, device=device, group=group, options=self.options.loader)
            loaded = model.load_weights(weights)
            logger.info("Loading weights took %.2f seconds", time.perf_counter() - started)
            if getattr(model_config, "quantization", None) is None and loaded is not None:
                missing = expected - set(loaded)
                if missing:
                    shown = ", ".join(sorted(missing)[:10])
                    more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
                    raise ValueError(
                        f"the checkpoint at {url} does not hold these weights of the model: "
                        f"{shown}{more}; check that --model-loader-extra-config's url names "
                        "the weights of this model"
                    )

    return AioloaderModelLoader


def _load_group() -> Any:
    """The gloo group of vLLM's tensor-parallel group, for ``group=``: the ranks that
    load this model at the same time (see the module); None when it has one rank.

    Raises:
        ConfigError: vLLM's model-parallel groups are not set up in this process.
    """
    from vllm.distributed import parallel_state

    try:
        group = parallel_state.get_tp_group()
    except AssertionError:  # vLLM asserts that the group exists
        group = None
    if group is None:
        raise ConfigError(
            '--model-loader-extra-config: "distributed": true needs vLLM\'s tensor-parallel '
            "group, which is not initialized in this process; load through vLLM's engine, "
            'or leave "distributed" out'
        )
    return group.cpu_group if group.world_size > 1 else None


def _weights(options: VllmOptions, model_config: Any) -> Location:
    """Where the weights are read from, parsed once (``weights_url``'s rules)."""
    from .sources.stores import Location, locate

    if options.url:
        return locate(options.url)
    model = str(getattr(model_config, "model_weights", None) or model_config.model)
    place = _hub_place(model, getattr(model_config, "revision", None))
    return locate(model) if place is None else Location.of_hub(place)


def weights_url(model: str, revision: str | None = None) -> str:
    """Where the weights of vLLM's ``model`` are read from.

    A URL and a path that exists are kept as they are; a Hub repository id
    (``org/name``) that is no local path becomes ``hf://org/name@revision``
    (``main`` without one); anything else is kept, to fail as a missing path.
    """
    place = _hub_place(model, revision)
    return model if place is None else place.url()


def _hub_place(model: str, revision: str | None) -> HfLocation | None:
    """The place on the Hub ``model`` names when it is a repository id (see
    ``weights_url``), at ``revision``; None when it is a URL or a path."""
    if "://" in model or os.path.exists(model):
        return None
    from .sources.hf.url import DEFAULT_REVISION, parse_hf_url

    try:
        location = parse_hf_url(f"hf://{model}")
    except ConfigError:
        return None
    if location.path or location.revision != DEFAULT_REVISION:
        return None  # "org/name/sub" or "org/name@x" is a path, not a repository id
    return location.at(revision=revision or DEFAULT_REVISION)


def _device_of(model: Any) -> str:
    for parameter in model.parameters():
        device = parameter.device
        if device.type == "cuda":
            return f"cuda:{device.index if device.index is not None else 0}"
        return str(device.type)
    return "cpu"
