"""Ray: preload every node's cache, and one host copy of a model per node.

An optional extra (``pip install "aioloader[ray]"``), built on Ray's own parts:
actors, node-affinity scheduling and the object store.

* Inside an async actor, ``await aioloader.load_model(url)`` works as anywhere
  else: the load runs on the actor's event loop, whose other calls keep being
  answered, and files and locks go with the process if the actor is killed.
* ``preload(urls, cache_dir=...)`` fills the node cache of every alive node (or
  of the nodes given) with one small actor per node, pinned there by
  ``NodeAffinitySchedulingStrategy(soft=False)``, through the same cache filling
  as ``aioloader serve``; it returns one ``NodePreload`` per node, failures
  included. Running it again finds the files cached.
* ``load_shared(url)`` gives an actor the model's tensors from a holder actor on
  its own node, which loaded them once into Ray's object store: N replicas on a
  node read the model once and map the same host memory (zero-copy, read-only).
  A holder serves one URL with one set of options (selection, rows, credentials,
  limits): callers that ask differently get holders of their own, named after a
  digest of what they asked, so no secret shows in an actor's name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import socket
import string
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .errors import ConfigError
from .settings.options import LoadOptions
from .settings.values import MAX_SECONDS, check_number
from .sources.stores import Location, locate

__all__ = ["NodePreload", "load_shared", "preload", "release_shared"]


@dataclass(frozen=True)
class NodePreload:
    """What ``preload`` did on one node.

    Attributes:
        node_id: Ray's id of the node.
        host: the node's address.
        cache_dir: the cache folder used on that node.
        fetched: bytes downloaded into the cache.
        cached: bytes found in the cache already.
        seconds: wall time on the node.
        error: why the node failed, or None.
    """

    node_id: str
    host: str
    cache_dir: str
    fetched: int = 0
    cached: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@ray.remote(num_cpus=0)
class _Preloader:
    """Fills one node's cache (one per node, for the time of a ``preload``)."""

    async def fetch(
        self, urls: list[Location], cache_dir: str, options: dict[str, Any]
    ) -> dict[str, Any]:
        from .cache.model_cache import ModelCache

        started = time.perf_counter()
        cache = ModelCache(cache_dir)
        fetched = total = 0
        for url in urls:
            model = await cache.fetch(url, **options)
            fetched += model.downloaded
            total += model.bytes
        return {
            "fetched": fetched,
            "cached": total - fetched,
            "seconds": time.perf_counter() - started,
            "host": socket.gethostname(),
        }


_FIELDS = ("node_id", "node_ip")


def check_cache_dir(cache_dir: object) -> str:
    """``cache_dir`` if it is a folder template ``preload`` can fill: text whose only
    fields are ``{node_id}`` and ``{node_ip}`` (``{{`` and ``}}`` for braces).

    Raises:
        ConfigError: naming the template and what is wrong with it.
    """
    if not isinstance(cache_dir, str | os.PathLike):
        raise ConfigError(f"cache_dir must be a folder path, got {cache_dir!r}")
    template = os.fspath(cache_dir)
    if not isinstance(template, str) or not template:
        raise ConfigError(f"cache_dir must be a non-empty folder path, got {cache_dir!r}")
    hint = "; the only fields are {node_id} and {node_ip} (write {{ and }} for braces)"
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"cache_dir {template!r}: {exc}{hint}") from None
    for _text, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in _FIELDS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise ConfigError(f"cache_dir {template!r}: {shown} cannot be filled in{hint}")
    return template


def _cache_dir_for(cache_dir: str, node: dict[str, Any]) -> str:
    """``cache_dir`` (checked by ``check_cache_dir``) filled in for ``node``."""
    return cache_dir.format(node_id=node["NodeID"], node_ip=node["NodeManagerAddress"])


def preload(
    urls: str | Sequence[str],
    *,
    cache_dir: str,
    nodes: Sequence[str] | None = None,
    timeout: float | None = None,
    **options: Any,
) -> list[NodePreload]:
    """Fill the node cache of every alive node (or of ``nodes``) with the models at ``urls``.

    Args:
        urls: model URLs (``s3://``, ``http(s)://``), as ``ModelCache.fetch`` takes them.
        cache_dir: the cache folder on each node; ``{node_id}`` and ``{node_ip}`` are
            replaced with the node's (for nodes that share one file system).
        nodes: Ray node ids; default every alive node.
        timeout: seconds to wait for all nodes; a node not done by then is reported
            failed (its actor is killed).
        options: how each node reads, as ``ModelCache.fetch`` takes them
            (``concurrency``, ``chunk_size``, ``headers``, retries, ``s3_*``: see
            aioloader/settings/options.py); checked here, before any actor starts.

    Returns:
        One NodePreload per node, in the order of ``nodes`` (or Ray's); a node that
        failed has ``error`` set, and the others are reported as they are.
    """
    cache_dir = check_cache_dir(cache_dir)
    for name in ("device", "framework", "group", "cache_dir"):
        if options.get(name) is not None:
            raise ConfigError(f"preload fills node caches; {name}= is for loads, not preloads")
    LoadOptions.build(environ={}, **options)  # refused here, not on every node
    if timeout is not None:
        check_number("timeout", timeout, maximum=MAX_SECONDS)
    if not ray.is_initialized():
        ray.init()
    # Each model's URL parsed once, here: the nodes fetch the Location (a bad URL fails
    # before any actor starts).
    url_list = [locate(u) for u in ([urls] if isinstance(urls, str) else list(urls))]
    alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    wanted = list(nodes) if nodes is not None else list(alive)
    pending: dict[str, tuple[Any, Any, str]] = {}
    results: dict[str, NodePreload] = {}
    for node_id in wanted:
        node = alive.get(node_id)
        if node is None:
            results[node_id] = NodePreload(node_id, "", "", error="no alive Ray node has this id")
            continue
        folder = _cache_dir_for(cache_dir, node)
        actor = _Preloader.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote()
        pending[node_id] = (actor, actor.fetch.remote(url_list, folder, options), folder)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for node_id, (_actor, ref, folder) in pending.items():
            host = alive[node_id]["NodeManagerAddress"]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                got = ray.get(ref, timeout=left)
            except ray.exceptions.GetTimeoutError:
                results[node_id] = NodePreload(
                    node_id, host, folder, error=f"not done within {timeout} s"
                )
            except Exception as exc:
                results[node_id] = NodePreload(node_id, host, folder, error=_cause(exc))
            else:
                results[node_id] = NodePreload(
                    node_id, host, folder, got["fetched"], got["cached"], got["seconds"]
                )
    finally:
        for actor, _ref, _folder in pending.values():
            ray.kill(actor)
    return [results[n] for n in wanted]


def _cause(exc: BaseException) -> str:
    """The error behind a Ray exception, in a line."""
    cause = getattr(exc, "cause", None) or exc
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


# -- one host copy per node ---------------------------------------------------------------


@ray.remote(num_cpus=0)
class _Holder:
    """Holds one model's tensors in the object store of its node."""

    def __init__(self) -> None:
        self._refs: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    async def refs(self, url: Location, options: dict[str, Any]) -> dict[str, Any]:
        """``{name: (object ref of the bytes, dtype name, shape)}``, loading on first call."""
        async with self._lock:
            if self._refs is None:
                from .api import load_model

                tensors = await load_model(url, **options)
                # Into the object store as bytes (NumPy has no bfloat16), one object per
                # tensor; the heap copy goes when this returns.
                self._refs = {
                    name: (
                        ray.put(t.reshape(-1).view(torch_uint8()).numpy()),
                        str(t.dtype).removeprefix("torch."),
                        tuple(t.shape),
                    )
                    for name, t in tensors.items()
                }
            return self._refs


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def _canonical(value: Any, where: str) -> Any:
    """``value`` as plain JSON data that is equal for equal options, or ConfigError."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, os.PathLike):
        return {"path": os.fspath(value)}
    if isinstance(value, Mapping):
        items = [(str(k), _canonical(v, f"{where}[{k!r}]")) for k, v in value.items()]
        return {"map": sorted(items)}
    if isinstance(value, list | tuple):
        return [_canonical(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, set | frozenset):
        members = [_canonical(v, where) for v in value]
        return {"set": sorted(members, key=lambda m: json.dumps(m, sort_keys=True))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # The dataclass's own equality: the fields it compares (HttpOptions leaves out its
        # url_policy).
        fields = {
            f.name: _canonical(getattr(value, f.name), f"{where}.{f.name}")
            for f in dataclasses.fields(value)
            if f.compare
        }
        return {type(value).__qualname__: fields}
    kind = type(value)
    if kind.__module__ == "torch" and kind.__name__ in ("device", "dtype"):
        return {kind.__name__: str(value)}
    what = "a function" if callable(value) else f"a {kind.__name__}"
    raise ConfigError(
        f"load_shared: {where} is {what}, which cannot tell one caller's request from "
        "another's, so the node's holder could hand out tensors loaded for someone else; "
        "pass plain values (tensors= as a list of names, rows= as {name: (start, stop)}, "
        "cache_dir= as a path)"
    )


def _holder_key(url: str | Sequence[str], options: Mapping[str, Any]) -> str:
    """A digest of the URL and every option: no secret (a header, a profile) in clear."""
    if "group" in options:
        raise ConfigError(
            "load_shared: group= does not apply: the node's holder loads the model alone"
        )
    plain = {"url": url, "options": _canonical(dict(options), "options")}
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=12, person=b"aioloader-hold").hexdigest()


def _holder_name(key: str, node_id: str) -> str:
    return f"aioloader-shared-{node_id[:16]}-{key}"


async def load_shared(url: str | Location, **options: Any) -> dict[str, Any]:
    """The tensors of ``url`` from the object store of this node, loaded once per node.

    The first caller on a node starts a holder actor there, named after the node and
    a digest of the URL and ``options``, so that every caller on the node asking the
    same finds the same one, and a caller asking otherwise (other ``tensors=`` or
    ``rows=``, other credentials) gets its own. The holder loads the model with
    ``load_model(url, **options)`` and puts each tensor into Ray's object store;
    every caller then maps those objects: zero-copy, one copy of host memory per node.

    ``options`` must be plain values that say what is asked: a function (a
    ``tensors=`` predicate, ``split_rows``) cannot, and is refused; so is ``group=``.

    Returns:
        ``{name: torch.Tensor}``, read-only: they are views of shared memory (writing
        into one fails). Clone a tensor to change it.

    Raises:
        ConfigError: an option is not a plain value (before any actor starts).
    """
    import torch

    where = url if isinstance(url, Location) else locate(url)  # parsed once, for the holder
    key = _holder_key(where.url, options)
    node_id = ray.get_runtime_context().get_node_id()
    holder = _Holder.options(  # type: ignore[attr-defined]
        name=_holder_name(key, node_id),
        namespace="aioloader",
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()
    refs: dict[str, Any] = await holder.refs.remote(where, options)
    names = list(refs)
    arrays = await asyncio.gather(*(refs[n][0] for n in names))
    tensors = {}
    with warnings.catch_warnings():
        # The arrays are read-only views of the object store, and so are the tensors.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, array in zip(names, arrays, strict=True):
            _, dtype, shape = refs[name]
            flat = torch.from_numpy(array)
            tensors[name] = flat.view(getattr(torch, dtype)).reshape(shape)
    return tensors


def release_shared(url: str, nodes: Sequence[str] | None = None, **options: Any) -> int:
    """Stop the holders of ``url`` loaded with ``options`` (the same as given to
    ``load_shared``), on ``nodes`` (default all): their objects are freed once no
    actor holds a tensor of them. Returns how many were stopped."""
    stopped = 0
    key = _holder_key(url, options)
    node_ids = list(nodes) if nodes is not None else [n["NodeID"] for n in ray.nodes()]
    for node_id in node_ids:
        try:
            holder = ray.get_actor(_holder_name(key, node_id), namespace="aioloader")
        except ValueError:
            continue
        ray.kill(holder)
        stopped += 1
    return stopped
