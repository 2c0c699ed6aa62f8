"""``load_shared``: one host copy of a model per node, in Ray's object store.

A holder actor on the caller's node loads the model once into the object store; each
replica maps the same memory (zero-copy, read-only). A holder serves one URL with one
set of options: callers that ask differently get holders of their own, named after a
digest of what they asked, so no secret shows in an actor's name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import ConfigError
from ..redact import redacting_logger
from ..sources.stores import Location, locate

__all__ = ["load_shared", "release_shared"]

logger = redacting_logger(__name__)


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
                from ..api import load_model

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
