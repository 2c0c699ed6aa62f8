"""Filling the Hugging Face hub cache while hf:// models stream.

``HfCacheWrites`` wraps an ``HfSource``: every weight file the source reads from the
network comes back as a ``FillingBlob`` (sinks/) whose ``HubSink`` (sink.py) also
fills the hub cache: for loads into host memory, its bytes are written once it
closes, after the load has returned (blob_writer.py); for staged (GPU) loads, whose
buffers are reused as soon as a read returns, each range is written into a
temporary file before its read returns (blob_through.py). Either way a file read
whole is committed only when its digest is the one the Hub publishes. The first time a
folder of a commit is loaded, the small non-weight files under that folder (config,
tokenizer, generation config...) are downloaded into the cache too, by
huggingface_hub itself, and the ref the URL named is recorded, so a serving engine
can start from the cache offline: a load of the repository's root fills in all of
them, a load of ``hf://org/name/text_encoder`` only those under ``text_encoder/``
(not the other folders' files, which a process would wait for at exit).

That work runs in the process's commit threads (sinks/commits.py), keyed by the
hub cache's folder; ``wait_hf_cache`` waits for it.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from ...redact import redacting_logger
from ...runtime.threads import Lane
from ...sources.base import Blob, Source
from ...sources.hf.hf_cache import HfCache, cache_root
from ...sources.hf.hub import HubSettings, download_file
from ...sources.hf.snapshot import Snapshot
from ...sources.hf.source import HfSource
from .. import commits
from .blob_writer import WeightFile
from .sink import filling

__all__ = ["HfCacheWrites", "is_small_file", "wait_hf_cache"]

logger = redacting_logger(__name__)

# Weights in formats a safetensors load never reads: left to the tools that read them.
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".gguf", ".ckpt", ".ot")
_SMALL = 64 << 20


def is_small_file(path: str, size: int) -> bool:
    """Whether ``path`` is one of the small non-weight files a serving engine needs."""
    name = path.lower()
    return size <= _SMALL and not name.endswith((".safetensors", *_OTHER_WEIGHTS))


async def wait_hf_cache(root: str | Path | None = None) -> None:
    """Wait until every hub cache write submitted so far under ``root`` (default: the
    cache in use now, ``cache_root()``) has finished. Cancelling leaves them running."""
    await commits.wait(Path(root) if root is not None else cache_root())


def _under(path: str, folder: str) -> bool:
    return not folder or path.startswith(folder + "/")


def _small_files(settings: HubSettings, cache: HfCache, snapshot: Snapshot, folder: str) -> None:
    """Record the snapshot's listing, download the small files under ``folder`` (``""``:
    all of them) and record its ref, in that order: a ref is the last thing a warm start
    looks for (a commit thread's job)."""
    try:
        cache.write_tree(snapshot.sha, snapshot.tree)
        for path, size in sorted(snapshot.files.items()):
            wanted = _under(path, folder) and is_small_file(path, size)
            if wanted and cache.find(snapshot.sha, path, size) is None:
                if settings.token is None:  # a warm load's settings carry none yet
                    settings = settings.with_token()
                download_file(settings, cache, snapshot, path)
        cache.write_ref(snapshot.revision, snapshot.sha)
    except Exception as exc:
        logger.warning(
            "Hugging Face cache %s: the small files of %s were not all cached: %s",
            cache.root,
            snapshot.describe(),
            exc,
        )


class HfCacheWrites(Source):
    """An ``HfSource`` whose network reads also fill the hub cache (see the module).

    Args:
        inner: the Hub's source; it belongs to the caller and stays open.
        through: for staged (GPU) loads, whose buffers are reused as soon as a read
            returns: the lane that writes each range before its read returns
            (blob_through.py). None: the reads land in host tensors that stay as
            they are, written after the load (blob_writer.py).
        lane: where the digests of the ranges kept for the write after are taken.

    Both ways are the one ``HubSink`` (sink.py) behind a ``FillingBlob`` (sinks/).
    """

    def __init__(self, inner: HfSource, *, through: Lane | None = None, lane: Lane) -> None:
        self.inner = inner
        self.through = through
        self.lane = lane
        self._seen: set[tuple[Path, str, str, str]] = set()

    def __repr__(self) -> str:
        mode = "through" if self.through is not None else "after"
        return f"<HfCacheWrites {self.inner!r} writes={mode}>"

    def statistics(self) -> object:
        return self.inner.statistics()

    async def list_dir(self, url: str) -> list[str] | None:
        return await self.inner.list_dir(url)

    def join(self, base: str, name: str) -> str:
        return self.inner.join(base, name)

    def parent(self, url: str) -> str:
        return self.inner.parent(url)

    async def open(self, url: str) -> Blob:
        opened = await self.inner.open_file(url)
        settings, snapshot = opened.settings, opened.snapshot
        cache = HfCache(settings.cache, snapshot.repo_id)
        folder = posixpath.dirname(opened.path)  # the folder the load reads
        key = (cache.root, snapshot.repo_id, snapshot.sha + "@" + snapshot.revision, folder)
        if key not in self._seen and not settings.offline:
            # Also for a commit read from the cache: one that huggingface_hub filled may
            # lack its listing, its small files or the ref.
            self._seen.add(key)
            commits.submit(cache.root, lambda: _small_files(settings, cache, snapshot, folder))
        if opened.cached:
            return opened.blob
        blob_id = snapshot.ids.get(opened.path, "")
        if not opened.path.endswith(".safetensors") or not blob_id:
            return opened.blob  # the small files are huggingface_hub's to write
        target = WeightFile(cache, snapshot, opened.path, opened.blob.size, blob_id)
        return await filling(opened.blob, target, self.through, self.lane)

    async def aclose(self) -> None:
        """Nothing of its own to close: the writes finish in the commit threads."""
