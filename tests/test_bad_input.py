"""Bad input: a clear error naming the file and what to do; never a crash or hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioloader import (
    AccessDeniedError,
    ConfigError,
    FormatError,
    HeaderError,
    ModelCache,
    NotFoundError,
    SelectionError,
    SourceError,
    UnsupportedFormatError,
    load_model,
)

from .helpers import random_tensors, write_file, write_raw, write_sharded

T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


async def _fails(path: Path | str, error: type[Exception], *words: str) -> str:
    with pytest.raises(error) as info:
        await load_model(str(path))
    message = str(info.value)
    assert str(path) in message or any(str(path) in str(a) for a in info.value.args), message
    for word in words:
        assert word in message, message
    return message


async def test_truncated_data(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(big=10_000))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    await _fails(path, HeaderError, "truncated", "tensor")


async def test_truncated_inside_length(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x10\x00\x00")
    await _fails(path, HeaderError, "too short")


async def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"")
    await _fails(path, HeaderError, "0 bytes")


async def test_header_length_beyond_file(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", {"a": T}, b"\0" * 8, length=5000)
    await _fails(path, HeaderError, "beyond the end")


async def test_header_length_absurd(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", {"a": T}, b"\0" * 8, length=1 << 40)
    await _fails(path, HeaderError, "limit")


async def test_header_not_json(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", b"{not json at all}", b"")
    await _fails(path, HeaderError, "not valid JSON")


async def test_header_not_object(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", [1, 2, 3], b"")
    await _fails(path, HeaderError, "JSON object")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}, ("'a'", "needs 8 bytes")),
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, ("'a'", "not ordered")),
        ({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, ("'a'", "beyond the end")),
        ({"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}, ("'a'", "unknown dtype")),
        ({"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}, ("'a'", "not supported")),
        ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, ("'a'", "shape")),
        ({"dtype": "F32", "shape": [2]}, ("'a'", "data_offsets")),
        ({"shape": [2], "data_offsets": [0, 8]}, ("'a'", "dtype")),
        ("nonsense", ("'a'", "must be an object")),
    ],
)
async def test_bad_tensor_entry(tmp_path: Path, entry: object, words: tuple[str, ...]) -> None:
    offsets = entry.get("data_offsets", [0, 8]) if isinstance(entry, dict) else [0, 8]
    size = 8 if "beyond" in words[1] else max(offsets)
    path = write_raw(tmp_path / "m.safetensors", {"a": entry}, b"\0" * size)
    await _fails(path, HeaderError, *words)


async def test_overlapping_tensors(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    path = write_raw(tmp_path / "m.safetensors", header, b"\0" * 12)
    await _fails(path, HeaderError, "overlaps", "'a'", "'b'")


async def test_hole_between_tensors(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
    }
    path = write_raw(tmp_path / "m.safetensors", header, b"\0" * 20)
    await _fails(path, HeaderError, "belong to no tensor")


async def test_trailing_bytes(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", {"a": T}, b"\0" * 9)
    await _fails(path, HeaderError, "after the last tensor")


async def test_bad_metadata(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", {"__metadata__": {"x": 1}, "a": T}, b"\0" * 8)
    await _fails(path, HeaderError, "__metadata__")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"PK\x03\x04" + b"\0" * 100, ("zip archive", "pytorch_model.bin")),
        (b"\x80\x02}q\x00" + b"\0" * 100, ("pickle",)),
        (b"GGUF\x03\x00\x00\x00" + b"\0" * 100, ("GGUF",)),
        (
            b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n",
            ("Git LFS pointer", "git lfs pull"),
        ),
        (b"<!DOCTYPE html><html>Access denied</html>" + b" " * 100, ("HTML",)),
    ],
    ids=["torch-zip", "pickle", "gguf", "lfs-pointer", "html"],
)
async def test_not_safetensors(tmp_path: Path, content: bytes, words: tuple[str, ...]) -> None:
    path = tmp_path / "pytorch_model.safetensors"
    path.write_bytes(content)
    await _fails(path, UnsupportedFormatError, "not safetensors", *words)


async def test_missing_path(tmp_path: Path) -> None:
    await _fails(tmp_path / "nope.safetensors", NotFoundError, "does not exist")


async def test_empty_folder(tmp_path: Path) -> None:
    await _fails(tmp_path, SourceError, "empty folder")


async def test_folder_with_only_bin(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04")
    await _fails(tmp_path, SourceError, "no .safetensors", "pytorch_model.bin", "PyTorch pickle")


async def test_folder_whose_weights_are_in_a_sub_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    write_file(tmp_path / "weights" / "model.safetensors", random_tensors(count=2))
    await _fails(tmp_path, SourceError, "no .safetensors", "check the path", "weights")


async def test_missing_shard(tmp_path: Path) -> None:
    index = write_sharded(tmp_path, random_tensors(count=9), shards=3)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    message = await _fails(index, NotFoundError, "model-00002-of-00003.safetensors")
    assert "download the complete model" in message


async def test_index_points_to_wrong_shard(tmp_path: Path) -> None:
    index = write_sharded(tmp_path, random_tensors(count=9), shards=3)
    doc = json.loads(index.read_text())
    name = sorted(doc["weight_map"])[0]
    doc["weight_map"][name] = "model-00003-of-00003.safetensors"
    index.write_text(json.dumps(doc))
    await _fails(index, FormatError, name, "different versions")


async def test_index_not_json(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text("{")
    await _fails(index, FormatError, "not valid JSON")


async def test_index_escaping_folder(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    await _fails(index, FormatError, "outside")


async def test_duplicate_tensor_across_files(tmp_path: Path) -> None:
    write_file(tmp_path / "a.safetensors", {"x": torch.ones(2)})
    write_file(tmp_path / "b.safetensors", {"x": torch.ones(2)})
    await _fails(tmp_path, FormatError, "'x'", "a.safetensors", "b.safetensors")


async def test_unknown_tensor_selected(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=3))
    with pytest.raises(SelectionError) as info:
        await load_model(str(path), tensors=["layer.1.wieght"])
    assert "did you mean 'layer.1.weight'" in str(info.value)


async def test_unsupported_scheme() -> None:
    with pytest.raises(ConfigError, match="gopher"):
        await load_model("gopher://host/model.safetensors")


@pytest.mark.parametrize(
    "url",
    ["http://[bad", "https://[::1/m.safetensors", "http://[zz]/m.safetensors", "s3://[b/m/",
     "hf://[org/name"],
)  # fmt: skip
async def test_a_url_that_does_not_parse_is_a_config_error(tmp_path: Path, url: str) -> None:
    """urllib's own ValueError ("Invalid IPv6 URL") escaped, naming no URL."""
    message = await _fails(url, ConfigError, "is not a valid URL")
    assert message.startswith(repr(url))
    with pytest.raises(ConfigError, match="is not a valid URL"):
        await ModelCache(tmp_path).fetch(url)


async def test_unsupported_device() -> None:
    with pytest.raises(ConfigError, match="tpu"):
        await load_model("/nonexistent", device="tpu")


def test_permission_denied(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", random_tensors(count=2))
    path.chmod(0)
    tmp_path.chmod(0o755)
    # root ignores file modes, so check as an unprivileged user when we are root
    # (importing everything first: the checkout may not be readable to that user).
    code = (
        "import asyncio, importlib, os, pkgutil, sys\n"
        "import aioloader, torch, numpy\n"
        "for m in pkgutil.walk_packages(aioloader.__path__, 'aioloader.'):\n"
        "    if m.name.endswith('__main__'): continue\n"
        "    try: importlib.import_module(m.name)\n"
        "    except ModuleNotFoundError as e:  # an integration whose extra is absent (ray)\n"
        "        if e.name.startswith('aioloader'): raise\n"
        "if os.getuid() == 0:\n"
        "    os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        f"    asyncio.run(aioloader.load_model({str(path)!r}))\n"
        "except aioloader.AccessDeniedError as exc:\n"
        "    print('DENIED', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert "DENIED" in out.stdout, out.stdout + out.stderr
    assert str(path) in out.stdout and "read access" in out.stdout
    assert issubclass(AccessDeniedError, PermissionError)


@pytest.mark.parametrize(
    "shard",
    [
        "%2e%2e/%2e%2e/etc/passwd",
        "..%2f..%2fetc%2fpasswd",
        "%2E%2E%2Fx.safetensors",
        "sub/%2e/x.safetensors",
        "/etc/passwd",
        "file:///etc/passwd",
        "s3://other-bucket/x.safetensors",
        "https://other.example/x.safetensors",
        "x\x00.safetensors",
        "x%00.safetensors",
        "..\\x.safetensors",
    ],
)
async def test_index_shard_names_are_checked_decoded(tmp_path: Path, shard: str) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": shard}}))
    message = await _fails(index, FormatError, "'a'", "outside")
    assert repr(shard) in message


async def test_deeply_nested_index(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    await _fails(index, FormatError, "not valid JSON", "nested too deeply")


async def test_deeply_nested_header(tmp_path: Path) -> None:
    header = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    await _fails(path, HeaderError, "nested too deeply")


async def test_dimension_too_large_for_any_framework(tmp_path: Path) -> None:
    header = {"huge": {"dtype": "F32", "shape": [0, 10**20], "data_offsets": [0, 0]}}
    path = write_raw(tmp_path / "m.safetensors", header)
    await _fails(path, HeaderError, "'huge'", "2**63")


@pytest.mark.parametrize("shape", [[2**40, 2**40, 0], [0, 2**40, 2**40], [2, 2**62, 2**62, 0]])
async def test_empty_tensor_too_big_to_index(tmp_path: Path, shape: list[int]) -> None:
    """No elements, yet its strides overflow 64 bits: torch raised a RuntimeError."""
    header = {"e": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}
    path = write_raw(tmp_path / "m.safetensors", header)
    await _fails(path, HeaderError, "'e'", "2**63 - 1 bytes")


async def test_shape_and_offsets_checked_with_exact_integers(tmp_path: Path) -> None:
    header = {"t": {"dtype": "F32", "shape": [2**40, 2**40, 2], "data_offsets": [0, 8]}}
    path = write_raw(tmp_path / "m.safetensors", header, bytes(8))
    await _fails(path, HeaderError, "'t'", f"needs {2**81 * 4} bytes")


async def test_index_naming_a_tensor_twice(tmp_path: Path) -> None:
    tensors = random_tensors(count=4)
    index = write_sharded(tmp_path, tensors, shards=2)
    doc = json.loads(index.read_text())
    first, shard = next(iter(doc["weight_map"].items()))
    other = next(s for s in doc["weight_map"].values() if s != shard)
    # JSON text with the key twice (json.dumps cannot write it): the last, right one
    # would win, and the load would go on as if the index were sound.
    body = json.dumps(doc["weight_map"])[1:-1]
    index.write_text(f'{{"weight_map": {{{json.dumps(first)}: "{other}", {body}}}}}')
    await _fails(index, FormatError, repr(first), "twice")


async def test_header_naming_a_tensor_twice(tmp_path: Path) -> None:
    body = b'{"a": %s, "a": %s}' % (json.dumps(T).encode(), json.dumps(T).encode())
    path = write_raw(tmp_path / "m.safetensors", body, bytes(8))
    await _fails(path, HeaderError, "'a' twice")


async def test_header_entry_with_a_key_twice(tmp_path: Path) -> None:
    body = b'{"a": {"dtype": "F32", "dtype": "I32", "shape": [2], "data_offsets": [0, 8]}}'
    path = write_raw(tmp_path / "m.safetensors", body, bytes(8))
    await _fails(path, HeaderError, "'dtype'", "twice")


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", b'"x"', b'{"a": 1,}', b'{"a" 1}', b'{"a": 1} x', b"{", b'{"a": 1 "b": 2}', b"{}x"],
)
async def test_header_json_errors(tmp_path: Path, body: bytes) -> None:
    path = write_raw(tmp_path / "m.safetensors", body)
    await _fails(path, HeaderError)


async def test_header_with_blanks_everywhere_loads(tmp_path: Path) -> None:
    body = b' \n{ "a" :\t{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]} ,\r\n'
    body += b' "__metadata__" : {"k": "v"} } \n'
    path = write_raw(tmp_path / "m.safetensors", body, bytes(8))
    got = await load_model(str(path))
    assert got["a"].tolist() == [0.0, 0.0]


_SHORT_OF_MEMORY = """
import asyncio, resource, sys
import aioloader

def vm_size():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

limit = vm_size() + (1 << 30)  # 1 GiB of address space left: the tensor needs 4
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    asyncio.run(aioloader.load_model(sys.argv[1], framework="numpy"))
except aioloader.OutOfMemoryError as exc:
    print(exc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
def test_an_allocation_that_fails_names_the_file_and_tensor(tmp_path: Path) -> None:
    """A tensor within what the process may use whose memory cannot be had anyway (here
    the address space is limited): NumPy's MemoryError, said as a LoaderError."""
    n = 4 << 30
    header = json.dumps({"w": {"dtype": "F32", "shape": [n // 4], "data_offsets": [0, n]}})
    raw = header.encode().ljust(-(-len(header) // 8) * 8, b" ")
    path = tmp_path / "m.safetensors"
    with path.open("wb") as file:
        file.write(len(raw).to_bytes(8, "little") + raw)
        file.truncate(8 + len(raw) + n)  # sparse: no disk used
    done = subprocess.run(
        [sys.executable, "-c", _SHORT_OF_MEMORY, str(path)],
        capture_output=True, text=True, check=False, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{path}: tensor 'w' holds {n} bytes" in done.stdout, done.stdout
    assert "could not be allocated" in done.stdout
