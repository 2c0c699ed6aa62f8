"""Which files ``aioloader fetch SRC DEST`` copies, and under which names (folder_copy.py).

- a folder that can be listed (local, ``s3://``, ``gs://``, ``az://``, ``hf://``): every
  file ``Source.list_dir`` names in it and in its sub-folders, but names that start
  with ``.``; at most ``MAX_DEPTH`` folders deep;
- an index URL, a single ``.safetensors`` URL or an unlisted HTTP folder ending in
  ``/`` (layout.py finds its shards): those files, plus the well-known config and
  tokenizer files next to them that exist (``WELL_KNOWN``);
- a URL with a query (a presigned URL) names one file: its name is the last segment
  of its path, decoded, never its query, and its siblings are not looked for.

Every name is checked before it is used (``folder_dest.name_problem``): none may leave
DEST, hold what a file system refuses, or be too long for one (names.py).
"""

from __future__ import annotations

import asyncio
from urllib.parse import unquote, urlsplit

from ..errors import NotFoundError, SourceError
from ..format.names import shown
from ..redact import redacting_logger
from ..runtime.tasks import gather
from ..sources.base import Source
from ..sources.layout import resolve_layout
from .dest import name_problem

__all__ = ["MAX_DEPTH", "WELL_KNOWN", "files_to_copy"]

logger = redacting_logger(__name__)

MAX_DEPTH = 32  # sub-folders below SRC: a listing that never ends is refused, not walked

# Files a model folder carries beside its weights, tried by name where no listing exists.
WELL_KNOWN = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "preprocessor_config.json",
    "chat_template.jinja",
)


def _checked_name(name: str, src: str) -> str:
    """A file name from a listing or an index, refused if it could leave DEST."""
    problem = name_problem(name)
    if problem is not None:
        raise SourceError(
            f"{src} lists a file named {shown(name)}, which {problem}: it cannot be copied "
            "safely; rename it at the source, or fetch the files it is not among"
        )
    return name


async def _exists(source: Source, url: str) -> bool:
    try:
        blob = await source.open(url)
    except NotFoundError:
        return False
    await blob.aclose()
    return True


async def _walk(
    source: Source, folder: str, names: list[str], under: str, src: str
) -> list[tuple[str, str]]:
    """``(url, relative name)`` of the files ``folder`` lists as ``names`` and of those
    in its sub-folders (listed here)."""
    files = [n for n in names if not n.startswith(".") and not n.endswith("/")]
    copies = [(source.join(folder, n), _checked_name(under + n, src)) for n in files]
    subs = [n[:-1] for n in names if not n.startswith(".") and n.endswith("/")]
    clash = set(files) & set(subs)
    if clash:
        raise SourceError(
            f"{src} lists {under + min(clash)!r} both as a file and as a folder; a folder on "
            "disk cannot hold both: remove one of them from the source"
        )
    found: dict[str, list[tuple[str, str]]] = {}

    async def walk(sub: str) -> None:
        name = _checked_name(under + sub, src)
        if name.count("/") >= MAX_DEPTH:
            raise SourceError(
                f"{src} nests folders more than {MAX_DEPTH} deep ({name!r}); that is no model "
                "folder: check the source, or fetch the folder that holds the model"
            )
        url = source.join(folder, sub + "/")  # a folder's URL: an empty one lists as one
        inside = await source.list_dir(url)
        if inside is None:
            raise SourceError(f"{src}: the folder {name!r} is gone or is a file now; fetch again")
        found[sub] = await _walk(source, url, inside, name + "/", src)

    await gather(walk(sub) for sub in subs)
    return copies + [copy for sub in sorted(found) for copy in found[sub]]


def _name_in(source: Source, folder: str, url: str, src: str) -> tuple[str, str]:
    """The name of ``url`` inside ``folder`` and the URL to copy it from: the one
    ``source.join`` makes of that name (percent-encoded, pinned to a commit)."""
    pinned = source.parent(source.join(folder, "x"))
    for prefix in dict.fromkeys((pinned + "/", folder + "/")):
        if url.startswith(prefix):
            written = url[len(prefix) :]
            for name in dict.fromkeys((written, unquote(written))):
                if source.join(folder, name) == url:
                    return _checked_name(name, src), url
            return _checked_name(written, src), url  # a URL not written as join writes it
    raise SourceError(f"{src} names {url}, which is not inside {folder}")


def _query_of(url: str) -> str:
    """The query of an ``http(s)://`` URL (a presigned URL's signature); "" for any
    other, where ``?`` is part of a name: a local path's, or an ``s3://``, ``gs://`` or
    ``az://`` key's (everything after the bucket is the key, as the AWS CLI takes it)."""
    parts = urlsplit(url)
    return parts.query if parts.scheme.lower() in ("http", "https") else ""


def _last_segment(url: str) -> str:
    """The name of the file at ``url``: the last segment of its path, percent-decoded,
    never its query. A segment whose decoded form holds a ``/`` or a NUL (``%2F``)
    stays as written: a name, not a way into another folder."""
    written = urlsplit(url).path.rsplit("/", 1)[-1]
    decoded = unquote(written)
    return written if "/" in decoded or "\0" in decoded else decoded


async def files_to_copy(source: Source, src: str) -> list[tuple[str, str]]:
    """``(url, relative name)`` of every file to copy from ``src`` (see the module)."""
    names = await source.list_dir(src)
    if names is not None:
        copies = await _walk(source, src, names, "", src)
        if not copies:
            raise SourceError(f"{src} is an empty folder; there is nothing to fetch")
        return copies
    layout = await resolve_layout(source, src)
    if layout.index is None and _query_of(src):
        # A presigned URL signs its one file: the file is named by its path, and its
        # siblings, which its signature does not cover, are not asked for.
        (url,) = layout.files
        logger.info("%s is signed for one file: its config files are not looked for", src)
        return [(url, _checked_name(_last_segment(url), src))]
    if layout.index is not None:
        folder = source.parent(layout.index)
    else:
        folder = src.rstrip("/") if src.endswith("/") else source.parent(layout.files[0])
    urls = list(layout.files) + ([layout.index] if layout.index else [])
    by_name = {name: url for name, url in (_name_in(source, folder, u, src) for u in urls)}
    extra = {n: source.join(folder, n) for n in WELL_KNOWN if n not in by_name}
    found = await asyncio.gather(*(_exists(source, u) for u in extra.values()))
    by_name |= {n: u for (n, u), there in zip(extra.items(), found, strict=True) if there}
    return [(url, name) for name, url in by_name.items()]
