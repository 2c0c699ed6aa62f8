"""Part of a tensor: rows ``[start, stop)`` of its first dimension, and only their bytes.

With tensor parallelism each rank keeps a slice of the big weights: a column-parallel
``[out, in]`` weight is split along ``out``, its first dimension. safetensors stores
tensors in row-major order, so such a slice is one contiguous byte range of the
file: a rank that asks for its rows reads those bytes alone, and nothing of that
tensor is exchanged with other ranks (see distributed.py). Slices along a later
dimension are strided (a few bytes from every row) and are not offered: load the
tensor and slice it in memory.

``rows=`` takes a mapping ``{name: (start, stop)}`` or a function
``(name, shape) -> (start, stop) | None``; ``split_rows`` makes the function for the
usual case, an even split of the first dimension across the ranks.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from ..errors import SelectionError
from ..format.safetensors import TensorInfo

__all__ = ["Rows", "narrow", "rows_of", "split_rows"]

RowRange = tuple[int, int]
Rows = Mapping[str, RowRange] | Callable[[str, tuple[int, ...]], RowRange | None] | None


def split_rows(
    rank: int, world_size: int, which: Callable[[str], bool] | None = None
) -> Callable[[str, tuple[int, ...]], RowRange | None]:
    """``rows=`` for rank ``rank`` of ``world_size``: an equal share of the first
    dimension of every tensor ``which`` accepts (every tensor of two or more
    dimensions when ``which`` is None), as a column-parallel layer splits its weight.

    A tensor whose first dimension does not divide evenly fails the load, naming it.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}) and world_size >= 1; got {rank}")

    def rows(name: str, shape: tuple[int, ...]) -> RowRange | None:
        if which is None:
            if len(shape) < 2:
                return None
        elif not which(name):
            return None
        if not shape:
            raise SelectionError(f"tensor {name!r} is a scalar: it has no rows to split")
        if shape[0] % world_size:
            raise SelectionError(
                f"tensor {name!r} has {shape[0]} rows (shape {list(shape)}), which do not split "
                f"evenly across {world_size} ranks; leave it out of split_rows(which=...)"
            )
        share = shape[0] // world_size
        return rank * share, (rank + 1) * share

    return rows


def _pair(name: str, value: object) -> RowRange:
    if isinstance(value, slice):
        if value.step not in (None, 1):
            raise SelectionError(f"rows of {name!r}: a step ({value.step}) is not supported")
        value = (value.start or 0, value.stop)
    if (
        not isinstance(value, tuple | list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise SelectionError(
            f"rows of {name!r} must be (start, stop) as two integers, got {value!r}"
        )
    return int(value[0]), int(value[1])


def rows_of(tensors: Iterable[TensorInfo], rows: Rows, url: str) -> dict[str, RowRange]:
    """The row range asked of each of ``tensors`` (the selected ones), checked.

    Raises:
        SelectionError: a name that is not among the tensors, a scalar, or a range
            outside the tensor's first dimension; naming the tensor and its shape.
    """
    if rows is None:
        return {}
    infos = {t.name: t for t in tensors}
    asked: dict[str, RowRange] = {}
    if callable(rows):
        for info in infos.values():
            try:
                got = rows(info.name, info.shape)
            except SelectionError as exc:
                raise SelectionError(f"{exc.args[0]} (loading {url})") from exc
            if got is not None:
                asked[info.name] = _pair(info.name, got)
    else:
        missing = sorted(set(rows) - infos.keys())
        if missing:
            name = missing[0]
            close = difflib.get_close_matches(name, infos.keys(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SelectionError(
                f"rows= names {name!r}{hint}, which is not among the tensors loaded from "
                f"{url}" + (f" ({len(missing) - 1} more such names)" if len(missing) > 1 else "")
            )
        asked = {name: _pair(name, value) for name, value in rows.items()}
    for name, (start, stop) in asked.items():
        shape = infos[name].shape
        if not shape:
            raise SelectionError(f"tensor {name!r} in {url} is a scalar: it has no rows")
        if not 0 <= start <= stop <= shape[0]:
            raise SelectionError(
                f"rows [{start}, {stop}) of tensor {name!r} in {url} are outside its first "
                f"dimension (shape {list(shape)}): ask for 0 <= start <= stop <= {shape[0]}"
            )
    return asked


def narrow(info: TensorInfo, start: int, stop: int) -> TensorInfo:
    """``info`` cut to rows ``[start, stop)``: a shorter tensor at a later offset."""
    row_bytes = info.nbytes // info.shape[0] if info.shape[0] else 0
    return replace(
        info,
        shape=(stop - start, *info.shape[1:]),
        start=info.start + start * row_bytes,
        end=info.start + stop * row_bytes,
    )
