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

When the blob closes having been read whole, a commit thread (sinks/commits.py) hashes the
file as written, from disk, checks the digest the Hub publishes (blob_writer.py's
``publish``), syncs it and renames it into place; then the snapshot's link is made.
A file not read whole (``tensors=``, a failed or cancelled load), a mismatch, or a
cache that cannot take the bytes: the temporary file is removed, and nothing
appears under a final name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

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

    def __repr__(self) -> str:
        return f"<TemporaryBlob {self.path}>"

    def write(self, offset: int, views: Sequence[memoryview]) -> None:
        """Write ``views`` back to back from ``offset``."""
        fd = self._fd
        assert fd is not None, "written after it was ended"
        for view in views:
            view = view.cast("B")
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], offset + done)
            offset += view.nbytes

    def publish(self) -> bool:
        """Commit the file when its bytes are the blob's (see the module); False, with a
        warning, when they are not. The temporary file is gone either way."""
        target, fd = self.target, self._fd
        assert fd is not None, "ended twice"
        try:
            if committed(target.cache, target.blob_id, target.size):
                return True  # another process or huggingface_hub was first
            digest = blob_digest(target.blob_id, target.size)
            for start in range(0, target.size, CHUNK):
                chunk = os.pread(fd, min(CHUNK, target.size - start), start)
                if not chunk:
                    break
                digest.update(chunk)
            os.fsync(fd)
            return publish(target.cache, target.blob_id, self.path, digest.hexdigest(), _CORRUPTED)
        finally:
            self.discard()

    def discard(self) -> bool:
        """Close and remove the temporary file (idempotent); False: nothing committed."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self.path.unlink(missing_ok=True)
        return False
