"""``load_shared``: one host copy of a model per node, in Ray's object store.

A holder actor on the caller's node loads the model once into the object store; each
replica maps the same memory (zero-copy, read-only). A holder serves one URL with one
set of options: callers that ask differently get holders of their own, named after a
digest of what they asked, so no secret shows in an actor's name. The holders of a
model on several nodes share one download from the origin: each has its node's agent
(agents.py) fetch the model into the node cache through the swarm, then loads from there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import ConfigError
from ..redact import redacting_logger
from ..sources.stores import Location, locate
from .preload import check_cache_dir, check_sharing

__all__ = ["load_shared", "release_shared"]

logger = redacting_logger(__name__)


# -- one host copy per node ---------------------------------------------------------------


@ray.remote(num_cpus=0)
class _Holder:
    """Holds one model's tensors in the object store of its node."""

    def __init__(self) -> None:
        self._refs: dict[str, Any] | None = None
        self._alone: str | None = None  # why this node's copy did not come through the swarm
        self._lock = asyncio.Lock()

    async def refs(
        self, url: Location, options: dict[str, Any], template: str | None, share: Any,
        swarm_port: int,
    ) -> dict[str, Any]:  # fmt: skip
        """``{"refs": {name: (object ref of the bytes, dtype name, shape)}, "alone": why
        or None, "host": ...}``, loading on first call: through the node's agent into the
        node cache first (agents.py), where ``template`` names one and ``share`` allows."""
        async with self._lock:
            if self._refs is None:
                from ..api import load_model

                folder = None if template is None else _node_folder(template)
                options = {**options, "cache_dir": folder or False}
                if folder is not None and share is not False:
                    from .agents import share_into_cache

                    fetch = {k: v for k, v in options.items() if k not in _FOR_LOADS}
                    got = await share_into_cache(
                        url, fetch, template or "", folder, swarm_port, share
                    )
                    self._alone = got.get("alone")
                    tensors = await _from_node_cache(got.get("path"), url, options)
                else:
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
            host = ray.util.get_node_ip_address()
            return {"refs": self._refs, "alone": self._alone, "host": host}


async def _from_node_cache(path: Any, url: Location, options: dict[str, Any]) -> Any:
    """The model from its layout in the node cache, as the agent just fetched it (no
    version probe to the origin again); through the cache as usual where there is none
    or it went meanwhile (evicted)."""
    from ..api import load_model
    from ..errors import LoaderError

    if path is not None:
        try:
            return await load_model(path, **{**options, "cache_dir": False})
        except (LoaderError, OSError) as exc:
            logger.info("loading %s from the node cache again: %s", url.url, exc)
    return await load_model(url, **options)


# What says how tensors are loaded, not how files are read: left out of the agent's fetch.
_FOR_LOADS = ("tensors", "rows", "device", "framework", "group", "cache_dir")


def _node_folder(template: str) -> str | None:
    """The node cache folder on this node: ``template`` filled in, or where none was
    given (``""``), ``$AIOLOADER_CACHE_DIR`` else ``~/.cache/aioloader`` (None: the
    variable says no cache)."""
    if template:
        node_id = ray.get_runtime_context().get_node_id()
        return template.format(node_id=node_id, node_ip=ray.util.get_node_ip_address())
    from ..daemon.config import default_cache_dir
    from ..settings.options import LoadOptions

    chosen = LoadOptions.build().cache_dir
    if chosen is False:
        return None
    return os.fspath(chosen) if isinstance(chosen, str | os.PathLike) else str(default_cache_dir())


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


_SHARING = ("share", "swarm_port")  # how a holder loads, not what it holds


def _holder_name(key: str, node_id: str) -> str:
    return f"aioloader-shared-{node_id[:16]}-{key}"


async def load_shared(
    url: str | Location, *, share: bool | None = None, swarm_port: int = 0, **options: Any
) -> dict[str, Any]:
    """The tensors of ``url`` from the object store of this node, loaded once per node,
    the nodes sharing one download from the origin.

    The first caller on a node starts a holder actor there, named after the node and
    a digest of the URL and ``options``, so that every caller on the node asking the
    same finds the same one, and a caller asking otherwise (other ``tensors=`` or
    ``rows=``, other credentials) gets its own. The holder has its node's agent
    (agents.py: one per node, found through a registry actor, peers of each other)
    fetch the model into the node cache through the swarm, then loads it from there
    with ``load_model(url, **options)`` and puts each tensor into Ray's object store;
    every caller then maps those objects: zero-copy, one copy of host memory per node.

    Args:
        url: the model, as ``load_model`` takes it.
        share: None: through the swarm where the node can (libtorrent installed, its
            swarm listening), else the holder pulls its own copy and a RuntimeWarning
            says what that costs; True: a node that cannot share fails; False: pull
            alone. It and ``swarm_port`` apply when a holder loads, and do not make
            holders of their own.
        swarm_port: the port the node's agent's swarm listens on when this call starts
            the agent (0: a free one); it must be open between the nodes.
        options: as ``load_model`` takes them. ``cache_dir``: the node cache folder
            (``{node_id}`` and ``{node_ip}`` are filled in, as for ``preload``); default
            ``$AIOLOADER_CACHE_DIR`` on the node, else ``~/.cache/aioloader``;
            ``False``: no node cache, so no swarm either (each node reads the origin).

    ``options`` must be plain values that say what is asked: a function (a
    ``tensors=`` predicate, ``split_rows``) cannot, and is refused; so is ``group=``.

    Returns:
        ``{name: torch.Tensor}``, read-only: they are views of shared memory (writing
        into one fails). Clone a tensor to change it.

    Raises:
        ConfigError: an option is not a plain value, or not usable (before any actor
            starts); with ``share=True``, a node that cannot share.
    """
    import torch

    where = url if isinstance(url, Location) else locate(url)  # parsed once, for the holder
    key = _holder_key(where.url, options)
    check_sharing(share, swarm_port)
    template = _template(options.get("cache_dir"))
    node_id = ray.get_runtime_context().get_node_id()
    got = await _from_holder(
        _holder_name(key, node_id), node_id, where, options, template, share, swarm_port
    )
    if got["alone"] is not None and share is None:
        from .agents import warn_alone

        shown = where.url if isinstance(where.url, str) else where.first
        warn_alone(node_id, got["host"], shown, got["alone"])
    refs: dict[str, Any] = got["refs"]
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


_PATH_MAX = 4096
# How long a holder's name may still lead to a holder that was stopped (``ray.kill``
# returns before the name is free) before a load or a release gives up on it.
_NAME_FREED = 30.0


async def _from_holder(
    name: str, node_id: str, where: Location, options: dict[str, Any], template: str | None,
    share: bool | None, swarm_port: int,
) -> dict[str, Any]:  # fmt: skip
    """The node's holder's answer: its refs. A holder stopped meanwhile (``release_shared``
    elsewhere, a crash) is replaced once its name is free: ``get_if_exists`` hands out
    the stopped one until then."""
    deadline = time.monotonic() + _NAME_FREED
    pause = 0.05
    while True:
        holder = _Holder.options(  # type: ignore[attr-defined]
            name=name,
            namespace="aioloader",
            get_if_exists=True,
            lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote()
        try:
            return await holder.refs.remote(where, options, template, share, swarm_port)  # type: ignore[no-any-return]
        except ray.exceptions.RayActorError:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


def _template(cache_dir: Any) -> str | None:
    """The node cache folder template (``""``: the default folder; None: no cache)."""
    if cache_dir is False:
        return None
    if cache_dir is None:
        return ""
    if isinstance(cache_dir, str | os.PathLike) and len(os.fspath(cache_dir)) > _PATH_MAX:
        raise ConfigError(
            f"load_shared: cache_dir is {len(os.fspath(cache_dir))} characters long, past "
            f"the {_PATH_MAX} a folder path can have; give the node cache's folder"
        )
    try:
        return check_cache_dir(cache_dir)
    except ConfigError as exc:
        raise ConfigError(f"load_shared: {exc}") from None


def release_shared(url: str, nodes: Sequence[str] | None = None, **options: Any) -> int:
    """Stop the holders of ``url`` loaded with ``options`` (the same as given to
    ``load_shared``), on ``nodes`` (default all): their objects are freed once no
    actor holds a tensor of them. Returns how many were stopped."""
    key = _holder_key(url, {k: v for k, v in options.items() if k not in _SHARING})
    node_ids = list(nodes) if nodes is not None else [n["NodeID"] for n in ray.nodes()]
    stopped = []
    for node_id in node_ids:
        name = _holder_name(key, node_id)
        try:
            holder = ray.get_actor(name, namespace="aioloader")
        except ValueError:
            continue
        ray.kill(holder)
        stopped.append(name)
    for name in stopped:  # all killed first: their names are freed side by side
        _wait_freed(name)
    return len(stopped)


def _wait_freed(name: str) -> None:
    """Wait until no actor is named ``name`` (``ray.kill`` returns first), so that a load
    after ``release_shared`` starts a new holder; at most ``_NAME_FREED`` seconds."""
    deadline = time.monotonic() + _NAME_FREED
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace="aioloader")
        except ValueError:
            return
        time.sleep(0.05)
