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
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

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
        self, urls: list[str], cache_dir: str, options: dict[str, Any]
    ) -> dict[str, Any]:
        from .cache.store import ModelCache

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


def _cache_dir_for(cache_dir: str, node: dict[str, Any]) -> str:
    """``cache_dir`` with ``{node_id}`` and ``{node_ip}`` filled in for ``node``."""
    return cache_dir.format(node_id=node["NodeID"], node_ip=node["NodeManagerAddress"])


def preload(
    urls: str | Sequence[str],
    *,
    cache_dir: str,
    nodes: Sequence[str] | None = None,
    concurrency: int | None = None,
    timeout: float | None = None,
) -> list[NodePreload]:
    """Fill the node cache of every alive node (or of ``nodes``) with the models at ``urls``.

    Args:
        urls: model URLs (``s3://``, ``http(s)://``), as ``ModelCache.fetch`` takes them.
        cache_dir: the cache folder on each node; ``{node_id}`` and ``{node_ip}`` are
            replaced with the node's (for nodes that share one file system).
        nodes: Ray node ids; default every alive node.
        concurrency: range reads in flight per node.
        timeout: seconds to wait for all nodes; a node not done by then is reported
            failed (its actor is killed).

    Returns:
        One NodePreload per node, in the order of ``nodes`` (or Ray's); a node that
        failed has ``error`` set, and the others are reported as they are.
    """
    if not ray.is_initialized():
        ray.init()
    url_list = [urls] if isinstance(urls, str) else list(urls)
    alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    wanted = list(nodes) if nodes is not None else list(alive)
    options = {} if concurrency is None else {"concurrency": concurrency}
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

    async def refs(self, url: str, options: dict[str, Any]) -> dict[str, Any]:
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


def _holder_name(url: str, node_id: str) -> str:
    return f"aioloader-shared-{node_id[:16]}-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


async def load_shared(url: str, **options: Any) -> dict[str, Any]:
    """The tensors of ``url`` from the object store of this node, loaded once per node.

    The first caller on a node starts a holder actor there (named after the node and
    the URL, so every caller on the node finds the same one), which loads the model
    with ``load_model(url, **options)`` and puts each tensor into Ray's object store;
    every caller then maps those objects: zero-copy, one copy of host memory per node.

    Returns:
        ``{name: torch.Tensor}``, read-only: they are views of shared memory (writing
        into one fails). Clone a tensor to change it.
    """
    import torch

    node_id = ray.get_runtime_context().get_node_id()
    holder = _Holder.options(  # type: ignore[attr-defined]
        name=_holder_name(url, node_id),
        namespace="aioloader",
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()
    refs: dict[str, Any] = await holder.refs.remote(url, options)
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


def release_shared(url: str, nodes: Sequence[str] | None = None) -> int:
    """Stop the holders of ``url`` (on ``nodes``, default all): their objects are freed
    once no actor holds a tensor of them. Returns how many were stopped."""
    stopped = 0
    node_ids = list(nodes) if nodes is not None else [n["NodeID"] for n in ray.nodes()]
    for node_id in node_ids:
        try:
            holder = ray.get_actor(_holder_name(url, node_id), namespace="aioloader")
        except ValueError:
            continue
        ray.kill(holder)
        stopped += 1
    return stopped
