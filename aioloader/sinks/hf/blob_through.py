"""A file read from the Hub by a staged (GPU) load, written into the hub cache as it arrives.

A staged load reads into slots of its staging ring, which go back to the readers
as soon as each copy to the device completes: the bytes are gone after the load,
so the write after the load (blob_writer.py) cannot serve it. The hub cache's sink
(sink.py) writes each range into ``TemporaryBlob``, a temporary file in ``blobs/``,
at the offset it belongs at, before its read returns (in the owner's ``cache``
lane: the read waits for its write, so the slot is not reused before its bytes are
on their way to disk, and memory stays bounded by the ring with no queue between
them). A range read twice, or overlapping another, is the same bytes written twice
at the same place.

When the blob closes having been read whole, a commit thread (sinks/commits.py) checks the
digest the Hub publishes (blob_writer.py's ``publish``), syncs the file and renames it into
place; then the snapshot's link is made. Where the load checked that digest itself
(``Blob.checked``: sources/verifying.py hashed every byte as it arrived) and no range
was written twice, the file holds the bytes it hashed, and they are not hashed again:
each was written from the memory it was read into before its read returned, the hash
read the same memory, and a change in between would have failed the load's check. Else
(a range written twice: its bytes may differ from the ones hashed) the file is hashed
as written, from disk.
A file not read whole (``tensors=``, a failed or cancelled load), a mismatch, or a
cache that cannot take the bytes: the temporary file is removed, and nothing
appears under a final name.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from ...reads.ranges import RangeSet
from ...sources.hf.hf_cache import sweep_temporaries, temporary_name
from .blob_writer import CHUNK, WeightFile, blob_digest, committed, publish

__all__ = ["TemporaryBlob"]

_CORRUPTED = "a corrupted download"


class TemporaryBlob:
    """A weight file's bytes on their way into ``blobs/<id>``: a temporary file beside
    the final name, written at any offset, by several threads at once (synchronous:
    run in threads). ``publish`` or ``discard`` ends it, once no write is running."""

    def __init__(self, target: WeightFile) -> None:
        final = target.cache.blob(target.blob_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        sweep_temporaries(final)
        self.target = target
        self.path = temporary_name(final)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self._fd: int | None = os.open(self.path, flags, 0o666)
        self._lock = threading.Lock()
        self._written = RangeSet()
        self.rewritten = False  # some byte was written again, maybe not as before

    def __repr__(self) -> str:
        return f"<TemporaryBlob {self.path}>"

    def write(self, offset: int, views: Sequence[memoryview]) -> None:
        """Write ``views`` back to back from ``offset``."""
        fd = self._fd
        assert fd is not None, "written after it was ended"
        end = offset + sum(v.nbytes for v in views)
        with self._lock:
            seen = [(max(a, offset), min(b, end)) for a, b in self._written if a < end > offset < b]
            self._written.add(offset, end)
        if seen and not self.rewritten:  # a header read twice: the same bytes, or not
            self.rewritten = not _same(fd, offset, views, seen)
        for view in views:
            view = view.cast("B")
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], offset + done)
            offset += view.nbytes

    def publish(self, checked: bool = False) -> bool:
        """Commit the file when its bytes are the blob's (see the module); False, with a
        warning, when they are not. ``checked``: the load hashed the bytes written here
        against the blob's id. The temporary file is gone either way."""
        target, fd = self.target, self._fd
        assert fd is not None, "ended twice"
        try:
            if committed(target.cache, target.blob_id, target.size):
                return True  # another process or huggingface_hub was first
            found = target.blob_id if checked and not self.rewritten else self._hash(fd)
            os.fsync(fd)
            return publish(target.cache, target.blob_id, self.path, found, _CORRUPTED)
        finally:
            self.discard()

    def _hash(self, fd: int) -> str:
        """The file's digest as written, read from disk."""
        target = self.target
        digest = blob_digest(target.blob_id, target.size)
        for start in range(0, target.size, CHUNK):
            chunk = os.pread(fd, min(CHUNK, target.size - start), start)
            if not chunk:
                break
            digest.update(chunk)
        return str(digest.hexdigest())

    def discard(self) -> bool:
        """Close and remove the temporary file (idempotent); False: nothing committed."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self.path.unlink(missing_ok=True)
        return False


def _same(fd: int, offset: int, views: Sequence[memoryview], spans: list[tuple[int, int]]) -> bool:
    """Whether the bytes of ``views`` (from ``offset``) in ``spans`` are those the file
    holds there already (False too where a write of them is still under way)."""
    joined = b"".join(bytes(v.cast("B")) for v in views)
    return all(os.pread(fd, b - a, a) == joined[a - offset : b - offset] for a, b in spans)
