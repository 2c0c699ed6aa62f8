"""Whether the tensors of a load can have memory at all, said before it is asked for.

A header (and a server's size) can claim a tensor of a terabyte: asking NumPy, torch or
CuPy for that raised their own ``MemoryError`` (or ``OutOfMemoryError``) naming neither
the file nor the tensor, and a petabyte held the event loop while its reads were
planned. Where a device knows the most memory the tensors of one load may take
(``Device.room``: for host memory, what this process may use, ``container_memory``), a
load that selects more is refused before its reads are planned (``plan_reads``); an
allocation that fails anyway is said the same way (``out_of_memory``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import OutOfMemoryError
from ..format.safetensors import TensorInfo
from ..runtime.container_memory import MemoryLimit
from ..settings.values import format_size

__all__ = ["check_room", "is_out_of_memory", "out_of_memory"]


def _named(url: str, tensor: TensorInfo) -> str:
    return (
        f"{url}: tensor {tensor.name!r} holds {tensor.nbytes} bytes ({format_size(tensor.nbytes)})"
    )


def check_room(files: Sequence[tuple[str, Sequence[TensorInfo]]], room: MemoryLimit) -> None:
    """Refuse a load whose tensors (``(url, tensors)`` per file) need more than ``room``.

    Raises:
        OutOfMemoryError: naming the largest tensor, its file and size, the total and
            the room there is.
    """
    total = sum(t.nbytes for _, tensors in files for t in tensors)
    if total <= room.bytes:
        return
    url, largest = max(
        ((url, t) for url, tensors in files for t in tensors), key=lambda pair: pair[1].nbytes
    )
    others = sum(len(tensors) for _, tensors in files) - 1
    together = f"; with the {others} other tensors asked for, {total} bytes" if others else ""
    raise OutOfMemoryError(
        f"{_named(url, largest)}{together}: more than this process may use at all "
        f"({format_size(room.bytes)}, from {room.source}). The header says so: check that "
        "this is the model you meant, load fewer tensors (tensors=...), or load where "
        "there is room for them"
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """NumPy's and CuPy's ``MemoryError``, torch's ``OutOfMemoryError`` (a RuntimeError)."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


def out_of_memory(
    url: str, tensors: Sequence[TensorInfo], nbytes: int, memory: str, exc: BaseException
) -> OutOfMemoryError:
    """The error for a failed allocation of ``nbytes`` for ``tensors`` of ``url`` (read as
    one span) in ``memory`` ("host memory", ...)."""
    largest = max(tensors, key=lambda t: t.nbytes)
    together = ""
    if len(tensors) > 1:
        together = f", read with {len(tensors) - 1} more ({nbytes} bytes in all)"
    detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return OutOfMemoryError(
        f"{_named(url, largest)}{together}, and {memory} for it could not be "
        f"allocated ({detail}). Free memory, load fewer tensors at once (tensors=...), or "
        "load where there is room for them"
    )
