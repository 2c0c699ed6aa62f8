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
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import HeaderError, UnsupportedFormatError
from .dtypes import DTYPE_SIZES

__all__ = [
    "DTYPE_SIZES",
    "DuplicateKeyError",
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


@dataclass(frozen=True, slots=True)
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


# Frameworks index with signed 64-bit integers: a tensor's extent in bytes (with each
# empty dimension counted as 1, as strides are) must fit, even in a tensor with no
# elements: torch cannot make ``[2**40, 2**40, 0]``, though it holds nothing.
_MAX_EXTENT = 2**63 - 1


def _parse_shape(url: str, name: str, value: Any, dtype: str) -> tuple[int, tuple[int, ...]]:
    """The shape as a tuple, and the tensor's size in bytes (exact integer arithmetic)."""
    if type(value) is not list or not all(type(d) is int and d >= 0 for d in value):
        raise _fail(
            url, f"tensor {name!r}: shape must be a list of non-negative ints, got {value!r}"
        )
    nbytes = math.prod(value) * DTYPE_SIZES[dtype]
    if nbytes == 0 and math.prod(max(d, 1) for d in value) * DTYPE_SIZES[dtype] > _MAX_EXTENT:
        raise _fail(
            url,
            f"tensor {name!r}: shape {value!r} x {dtype} spans more than 2**63 - 1 bytes, "
            "which no framework can index (though it has no elements); the header is corrupt",
        )
    return nbytes, tuple(value)


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice (``json`` would keep the last silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return found


_DECODER = json.JSONDecoder(object_pairs_hook=_unique)
_SPACE = re.compile(r"[ \t\n\r]*")
_BLANKS = frozenset(" \t\n\r")


def load_json(raw: bytes | str) -> Any:
    """``json.loads`` that refuses duplicate keys and reports too-deep nesting, both as
    ``ValueError`` like any bad JSON (``DuplicateKeyError`` for the former).

    Headers and indexes are flat; nesting deep enough to exhaust the parser's stack
    is an attack or corruption, never a model. A key given twice is one of two
    values silently lost.
    """
    try:
        return json.loads(raw, object_pairs_hook=_unique)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


class _NotAnObject(Exception):
    """The JSON document is valid but not an object; the argument names its type."""


def _skip(text: str, at: int) -> int:
    """The index of the first non-whitespace character at or after ``at``."""
    if text[at : at + 1] not in _BLANKS:
        return at  # safetensors writes compact JSON: the common case
    found = _SPACE.match(text, at)
    assert found is not None  # the pattern matches the empty string
    return found.end()


def _members(text: str) -> Iterator[tuple[str, Any]]:
    """The name/value pairs of the JSON object ``text``, in order, decoded one value at
    a time: each is one short call into the C decoder, so a thread parsing a huge header
    lets the event loop's thread run between them (``json.loads`` of a header of many
    megabytes holds the GIL for the whole parse).

    Raises:
        ValueError: bad JSON; DuplicateKeyError for a name given twice.
        _NotAnObject: valid JSON that is not an object.
    """
    decode = _DECODER.raw_decode
    at = _skip(text, 0)
    if text[at : at + 1] != "{":
        value, _ = decode(text, at)  # raises the JSON error if it is not JSON at all
        raise _NotAnObject(type(value).__name__)
    at = _skip(text, at + 1)
    if text[at : at + 1] == "}":
        at += 1
    else:
        seen: set[str] = set()
        while True:
            if text[at : at + 1] != '"':
                raise json.JSONDecodeError("Expecting property name in double quotes", text, at)
            name, at = decode(text, at)
            if name in seen:
                raise DuplicateKeyError(name)
            seen.add(name)
            at = _skip(text, at)
            if text[at : at + 1] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
            value, at = decode(text, _skip(text, at + 1))
            yield name, value
            at = _skip(text, at)
            delimiter = text[at : at + 1]
            if delimiter == "}":
                at += 1
                break
            if delimiter != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
            at = _skip(text, at + 1)
    if _skip(text, at) != len(text):
        raise json.JSONDecodeError("Extra data", text, at)


def parse_header(raw: bytes, url: str, file_size: int) -> FileHeader:
    """Parse and validate the JSON header of a safetensors file.

    Pure and synchronous; for a big header (hundreds of thousands of tensors, seconds)
    call it in a thread: it lets the GIL go between tensors.

    Args:
        raw: the header bytes (without the 8-byte length prefix).
        url: names the file in error messages.
        file_size: total size of the file, to check every offset against.

    Raises:
        HeaderError: the header is not JSON, not an object, names a tensor twice, or any
            tensor entry is inconsistent (dtype, shape, offsets, overlaps, gaps, size).
    """
    data_start = PREFIX_SIZE + len(raw)
    data_size = file_size - data_start
    metadata: dict[str, str] = {}
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    try:
        text = raw.decode("utf-8")
        for name, entry in _members(text):
            if name == "__metadata__":
                metadata = _parse_metadata(url, entry)
            else:
                entries.append(_parse_entry(url, name, entry, data_size))
    except _NotAnObject as exc:
        raise _fail(url, f"header must be a JSON object, got {exc}") from None
    except DuplicateKeyError as exc:
        raise _fail(
            url,
            f"the header names {exc.key!r} twice; which one is meant cannot be told: the "
            "file is corrupt or was written by a broken tool",
        ) from None
    except RecursionError:
        raise _fail(url, "header is not valid JSON (JSON nested too deeply)") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        sniff_format(raw, url)
        raise _fail(url, f"header is not valid JSON ({exc}); the file is corrupt") from exc

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


def _parse_metadata(url: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _fail(url, "__metadata__ must be an object of string keys and string values")
    return value


def _parse_entry(
    url: str, name: str, entry: Any, data_size: int
) -> tuple[int, int, str, str, tuple[int, ...]]:
    """One tensor's entry, checked: ``(begin, end, name, dtype, shape)`` in data offsets."""
    if type(entry) is not dict:
        raise _fail(url, f"tensor {name!r}: entry must be an object, got {entry!r}")
    dtype = entry.get("dtype")
    if dtype not in DTYPE_SIZES:
        if not isinstance(dtype, str):
            raise _fail(url, f"tensor {name!r}: missing or invalid dtype {dtype!r}")
        if dtype in _KNOWN_UNSUPPORTED:
            raise _fail(
                url,
                f"tensor {name!r}: dtype {dtype} (sub-byte float) is not supported by "
                "aioloader; select other tensors or convert the checkpoint",
            )
        raise _fail(
            url,
            f"tensor {name!r}: unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_SIZES))}",
        )
    expected, shape = _parse_shape(url, name, entry.get("shape"), dtype)
    offsets = entry.get("data_offsets")
    if type(offsets) is not list or len(offsets) != 2 or not all(type(o) is int for o in offsets):
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
    if end - begin != expected:
        raise _fail(
            url,
            f"tensor {name!r}: shape {list(shape)} x {dtype} needs {expected} bytes but "
            f"data_offsets [{begin}, {end}) hold {end - begin}",
        )
    return begin, end, name, dtype, shape
