"""Which files make up a model: a file, a folder of shards, or an index.json."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

from ..errors import FormatError, NotFoundError, SourceError
from ..format.names import length_problem, shown
from ..format.safetensors import DuplicateKeyError, load_json
from .base import Source

__all__ = ["INDEX_SUFFIX", "ModelLayout", "parse_index", "resolve_layout"]

INDEX_SUFFIX = ".index.json"
SAFETENSORS_SUFFIX = ".safetensors"
# Files people often find where they expected safetensors, with what to do.
_NOT_SUPPORTED = {
    ".bin": "PyTorch pickle",
    ".pt": "PyTorch pickle",
    ".pth": "PyTorch pickle",
    ".ckpt": "checkpoint pickle",
    ".gguf": "GGUF",
    ".h5": "Keras HDF5",
    ".msgpack": "Flax msgpack",
    ".onnx": "ONNX",
}


@dataclass(frozen=True)
class ModelLayout:
    """The files of one model.

    Attributes:
        files: URLs of the safetensors files, in load order.
        weight_map: tensor name -> file URL, when an index named them.
        metadata: the index's ``metadata`` object, if any.
        index: URL of the index file, if one was used.
    """

    files: tuple[str, ...]
    weight_map: dict[str, str] | None = None
    metadata: dict[str, object] = field(default_factory=dict)
    index: str | None = None


def parse_index(raw: bytes, url: str) -> ModelLayout:
    """Parse a Hugging Face ``*.safetensors.index.json``.

    Args:
        raw: the file's bytes.
        url: names it in errors.

    Returns:
        A layout whose ``files`` and ``weight_map`` hold shard names as written,
        relative to the index's folder.

    Raises:
        FormatError: not JSON, or no usable ``weight_map``.
    """
    try:
        doc = load_json(raw)
    except DuplicateKeyError as exc:
        raise FormatError(
            f"{url}: the index names {exc.key!r} twice in one object (JSON keeps only the "
            "last, silently); the index is corrupt: download it again or fix it by hand"
        ) from exc
    except ValueError as exc:
        raise FormatError(f"{url}: index is not valid JSON ({exc})") from exc
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise FormatError(
            f'{url}: an index needs a "weight_map" object of tensor name -> shard file'
        )
    for name, shard in weight_map.items():
        problem = _shard_problem(shard)
        if problem:
            raise FormatError(
                f"{url}: tensor {shown(name)} maps to shard {shown(shard)}, which {problem}; "
                "an index names its shards as files in its own folder, never outside it"
            )
    shards = list(dict.fromkeys(weight_map.values()))
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return ModelLayout(
        files=tuple(shards), weight_map=dict(weight_map), metadata=metadata, index=url
    )


def _shard_problem(shard: str) -> str | None:
    """Why a shard name from an index is refused, or None.

    Names are checked as written and percent-decoded (a remote source and the
    cache decode them later), so ``%2e%2e/`` is as much a way out as ``../``.
    """
    if not shard:
        return "is empty"
    too_long = length_problem(shard)
    if too_long is not None:
        return too_long
    for form in dict.fromkeys((shard, unquote(shard))):
        if any(ord(c) < 0x20 or c == "\x7f" for c in form):
            return "holds a control character"
        if "\\" in form:
            return "holds a backslash"
        if ":" in form.split("/", 1)[0]:
            return "is a URL (a scheme, or a drive), not a name in the index's folder"
        if form.startswith("/"):
            return "is an absolute path"
        if any(part in ("..", ".") for part in form.split("/")):
            return "has a '.' or '..' segment"
    return None


async def _from_index(source: Source, url: str) -> ModelLayout:
    parsed = parse_index(await source.read_file(url), url)
    folder = source.parent(url)
    files = tuple(source.join(folder, name) for name in parsed.files)
    assert parsed.weight_map is not None
    by_name = dict(zip(parsed.files, files, strict=True))
    weight_map = {k: by_name[v] for k, v in parsed.weight_map.items()}
    return ModelLayout(files=files, weight_map=weight_map, metadata=parsed.metadata, index=url)


async def _unlisted_folder(source: Source, url: str) -> ModelLayout:
    index = source.join(url, "model.safetensors.index.json")
    try:
        return await _from_index(source, index)
    except NotFoundError:
        pass
    single = source.join(url, "model.safetensors")
    try:
        blob = await source.open(single)
    except NotFoundError:
        raise NotFoundError(
            f"{url} cannot be listed, and holds neither model.safetensors.index.json nor "
            "model.safetensors; give the URL of the index or of each .safetensors file"
        ) from None
    await blob.aclose()
    return ModelLayout(files=(single,))


def _describe_other(names: list[str]) -> str:
    found = []
    for name in names:
        for suffix, kind in _NOT_SUPPORTED.items():
            if name.endswith(suffix):
                found.append(f"{name} ({kind})")
    if not found:
        shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
        return f": {shown}; check the path (the weights may be in a sub-folder)"
    return (
        f"; it holds {', '.join(found[:5])}, which aioloader cannot read: "
        "use the model's safetensors release"
    )


async def resolve_layout(source: Source, url: str | Sequence[str]) -> ModelLayout:
    """Find the files behind ``url``: an index, a folder, a single file, or a list of files.

    A folder with an ``*.safetensors.index.json`` loads exactly the shards the
    index names (``model.safetensors.index.json`` wins when there are several);
    otherwise every ``*.safetensors`` file in it, in name order. A folder that
    cannot be listed (an HTTP URL ending in ``/``) is read as a Hugging Face
    model folder: its ``model.safetensors.index.json``, else ``model.safetensors``.

    Raises:
        NotFoundError: the path or the index does not exist.
        SourceError: a folder with no safetensors files.
        FormatError: a malformed index.
    """
    if not isinstance(url, str):
        return ModelLayout(files=tuple(url))
    if url.endswith(INDEX_SUFFIX):
        return await _from_index(source, url)
    names = await source.list_dir(url)
    if names is None:
        if url.endswith("/"):
            return await _unlisted_folder(source, url)
        return ModelLayout(files=(url,))
    indexes = [n for n in names if n.endswith(SAFETENSORS_SUFFIX + INDEX_SUFFIX)]
    if indexes:
        chosen = "model.safetensors.index.json"
        if chosen not in indexes:
            if len(indexes) > 1:
                raise FormatError(
                    f"{url} holds several indexes ({', '.join(indexes)}); pass the one to load"
                )
            chosen = indexes[0]
        return await _from_index(source, source.join(url, chosen))
    files = [n for n in names if n.endswith(SAFETENSORS_SUFFIX)]
    folders = [n for n in names if n.endswith(SAFETENSORS_SUFFIX + "/")]  # see list_dir
    if folders:
        raise SourceError(
            f"{source.join(url, folders[0][:-1])} is a directory where a file was expected "
            "(every .safetensors in the folder is loaded): rename or remove it"
        )
    if not files:
        if not names:
            raise SourceError(f"{url} is an empty folder; expected .safetensors files in it")
        raise SourceError(
            f"{url} holds no .safetensors files ({len(names)} other entries)"
            + _describe_other(names)
        )
    return ModelLayout(files=tuple(source.join(url, n) for n in files))
