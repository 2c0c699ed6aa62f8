"""The safetensors header: parse and validate it before reading a single tensor byte.

Layout of a safetensors file::

    [8 bytes: header length N, little-endian u64][N bytes: JSON header][data]

The JSON maps tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the start of the data) plus an optional ``__metadata__`` of
string pairs. Everything here is pure: bytes in, validated description out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .dtypes import DTYPE_SIZES
from .errors import HeaderError, UnsupportedFormatError

__all__ = [
    "DTYPE_SIZES",
    "FileHeader",
    "MAX_HEADER_SIZE",
    "PREFIX_SIZE",
    "TensorInfo",
    "parse_header",
    "parse_header_length",
    "sniff_format",
]

PREFIX_SIZE = 8
# The reference implementation refuses headers above 100 MB; so do we, before
# allocating anything for them.
MAX_HEADER_SIZE = 100_000_000

# Dtypes the format defines that no supported framework can hold as plain tensors.
_KNOWN_UNSUPPORTED = {"F4", "F6_E2M3", "F6_E3M2"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it.

    Attributes:
        name: the tensor's key in the header.
        dtype: the safetensors dtype string, e.g. ``"BF16"``.
        shape: dimensions; ``()`` for a scalar.
        start: absolute offset of the first byte in the file.
        end: absolute offset one past the last byte.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class FileHeader:
    """A validated header of one safetensors file.

    Attributes:
        url: the file it came from.
        data_start: absolute offset where tensor data begins.
        tensors: tensors in file order (ascending offset).
        metadata: the ``__metadata__`` string pairs, or an empty dict.
    """

    url: str
    data_start: int
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def sniff_format(prefix: bytes, url: str) -> None:
    """Raise a clear error when a file's first bytes say it is not safetensors.

    ``prefix`` should hold the first 8 or more bytes. Does nothing for bytes that
    could be a safetensors header.
    """
    what = None
    hint = "convert it to safetensors (e.g. with safetensors.torch.save_file) and load that"
    if prefix.startswith(b"PK\x03\x04"):
        what = "a zip archive (PyTorch's torch.save format, e.g. pytorch_model.bin)"
    elif prefix[:1] == b"\x80" and prefix[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        what = "a Python pickle (legacy PyTorch .bin); pickles can run code when loaded"
    elif prefix.startswith(b"GGUF"):
        what = "a GGUF file (llama.cpp)"
        hint = "use the safetensors release of this model"
    elif prefix.startswith(b"\x93NUMPY"):
        what = "a NumPy .npy array"
    elif prefix.startswith(b"\x89HDF"):
        what = "an HDF5 file (Keras .h5)"
    elif prefix.startswith(b"version https://git-lfs"):
        what = "a Git LFS pointer, not the weights it points to"
        hint = "run `git lfs pull` in that repository (or download the file itself)"
    elif prefix.startswith(b"\x1f\x8b"):
        what = "a gzip archive"
        hint = "unpack it first"
    elif prefix.lstrip()[:1] in (b"<",):
        what = "an HTML or XML document (often an error page saved in place of the file)"
        hint = "download the file again and check its size"
    if what is not None:
        raise UnsupportedFormatError(
            f"{url} is {what}, not safetensors; aioloader reads safetensors only: {hint}"
        )


def parse_header_length(prefix: bytes, url: str, file_size: int) -> int:
    """Read the 8-byte header length and check it against the file size.

    Raises:
        UnsupportedFormatError: the file is a known non-safetensors format.
        HeaderError: the file is too short or the length is impossible.
    """
    if file_size < PREFIX_SIZE or len(prefix) < PREFIX_SIZE:
        sniff_format(prefix, url)
        raise HeaderError(
            f"{url} is {file_size} bytes long, too short to be safetensors (needs at least "
            f"{PREFIX_SIZE} bytes of header length); the file is truncated or empty: "
            "download it again"
        )
    length = int.from_bytes(prefix[:PREFIX_SIZE], "little")
    if length > MAX_HEADER_SIZE or length > file_size - PREFIX_SIZE:
        sniff_format(prefix, url)
        if length > file_size - PREFIX_SIZE and length <= MAX_HEADER_SIZE:
            raise HeaderError(
                f"{url}: header length {length} bytes reaches beyond the end of the "
                f"{file_size}-byte file; the file is truncated: download it again"
            )
        raise HeaderError(
            f"{url}: header length {length} bytes exceeds the {MAX_HEADER_SIZE}-byte limit; "
            "this is not a safetensors file or it is corrupt"
        )
    if length < 2:
        raise HeaderError(f"{url}: header length {length} is too small to hold a JSON object")
    return length


def _fail(url: str, message: str) -> HeaderError:
    return HeaderError(f"{url}: {message}")


# Frameworks index with signed 64-bit integers: no dimension may exceed that, even in a
# tensor with no elements (``[0, 10**20]`` holds nothing, yet torch cannot make it).
_MAX_DIM = 2**63 - 1


def _parse_shape(url: str, name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise _fail(
            url, f"tensor {name!r}: shape must be a list of non-negative ints, got {value!r}"
        )
    if any(d > _MAX_DIM for d in value):
        raise _fail(
            url,
            f"tensor {name!r}: shape {value!r} has a dimension above 2**63 - 1, which no "
            "framework can index; the header is corrupt",
        )
    return tuple(value)


def load_json(raw: bytes | str) -> Any:
    """``json.loads`` that reports too-deep nesting as a ``ValueError`` like any bad JSON.

    Headers and indexes are flat; nesting deep enough to exhaust the parser's stack
    is an attack or corruption, never a model.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_header(raw: bytes, url: str, file_size: int) -> FileHeader:
    """Parse and validate the JSON header of a safetensors file.

    Args:
        raw: the header bytes (without the 8-byte length prefix).
        url: names the file in error messages.
        file_size: total size of the file, to check every offset against.

    Raises:
        HeaderError: the header is not JSON, not an object, or any tensor entry is
            inconsistent (dtype, shape, offsets, overlaps, gaps, size).
    """
    data_start = PREFIX_SIZE + len(raw)
    try:
        doc = load_json(raw)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        sniff_format(raw, url)
        raise _fail(url, f"header is not valid JSON ({exc}); the file is corrupt") from exc
    if not isinstance(doc, dict):
        raise _fail(url, f"header must be a JSON object, got {type(doc).__name__}")

    metadata: dict[str, str] = {}
    raw_meta = doc.pop("__metadata__", None)
    if raw_meta is not None:
        if not isinstance(raw_meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw_meta.items()
        ):
            raise _fail(url, "__metadata__ must be an object of string keys and string values")
        metadata = dict(raw_meta)

    data_size = file_size - data_start
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    for name, entry in doc.items():
        if not isinstance(entry, dict):
            raise _fail(url, f"tensor {name!r}: entry must be an object, got {entry!r}")
        dtype = entry.get("dtype")
        if not isinstance(dtype, str):
            raise _fail(url, f"tensor {name!r}: missing or invalid dtype {dtype!r}")
        if dtype not in DTYPE_SIZES:
            if dtype in _KNOWN_UNSUPPORTED:
                raise _fail(
                    url,
                    f"tensor {name!r}: dtype {dtype} (sub-byte float) is not supported by "
                    "aioloader; select other tensors or convert the checkpoint",
                )
            raise _fail(
                url,
                f"tensor {name!r}: unknown dtype {dtype!r}; "
                f"known: {', '.join(sorted(DTYPE_SIZES))}",
            )
        shape = _parse_shape(url, name, entry.get("shape"))
        offsets = entry.get("data_offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise _fail(url, f"tensor {name!r}: data_offsets must be [begin, end], got {offsets!r}")
        begin, end = offsets
        if begin < 0 or end < begin:
            raise _fail(url, f"tensor {name!r}: data_offsets [{begin}, {end}] are not ordered")
        if end > data_size:
            raise _fail(
                url,
                f"tensor {name!r}: bytes [{begin}, {end}) of the data lie beyond the end of the "
                f"file (data holds {data_size} bytes); the file is truncated: download it again",
            )
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - begin != expected:
            raise _fail(
                url,
                f"tensor {name!r}: shape {list(shape)} x {dtype} needs {expected} bytes but "
                f"data_offsets [{begin}, {end}) hold {end - begin}",
            )
        entries.append((begin, end, name, dtype, shape))

    entries.sort()
    position = 0
    previous = None
    for begin, end, name, _, _ in entries:
        if begin < position:
            raise _fail(
                url,
                f"tensor {name!r} at data bytes [{begin}, {end}) overlaps tensor {previous!r} "
                f"which ends at {position}",
            )
        if begin > position:
            raise _fail(
                url,
                f"data bytes [{position}, {begin}) before tensor {name!r} belong to no tensor; "
                "safetensors files must be packed without holes",
            )
        position, previous = end, name
    if position != data_size:
        raise _fail(
            url,
            f"the file holds {data_size - position} bytes after the last tensor; it was "
            "modified or is not a safetensors file",
        )
    tensors = tuple(
        TensorInfo(name, dtype, shape, data_start + begin, data_start + end)
        for begin, end, name, dtype, shape in entries
    )
    return FileHeader(url=url, data_start=data_start, tensors=tensors, metadata=metadata)
