"""A file read from the Hub by a staged (GPU) load, written into the hub cache as it arrives.

A staged load reads into slots of its staging ring, which go back to the readers
as soon as each copy to the device completes: the bytes are gone after the load,
so ``RecordingBlob``'s write after the load (blob_writer.py) cannot serve it.
``WritingBlob`` writes each range into ``TemporaryBlob``, a temporary file in
``blobs/``, at the offset it belongs at, before its read returns (in the owner's
``cache`` lane: the read waits for its write, so the slot is not reused before its
bytes are on their way to disk, and memory stays bounded by the ring with no queue
between them). A range read twice, or overlapping another, is the same bytes written
twice at the same place.

When the blob closes having been read whole, a commit thread (commit.py) hashes the
file as written, from disk, checks the digest the Hub publishes (blob_writer.py's
``publish``), syncs it and renames it into place; then the snapshot's link is made.
A file not read whole (``tensors=``, a failed or cancelled load), a mismatch, or a
cache that cannot take the bytes: the temporary file is removed, and nothing
appears under a final name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ...cache.ranges import RangeSet
from ...threads import Lane, run_blocking
from ..base import Blob, ForwardingBlob, clip
from .blob_writer import CHUNK, WeightFile, blob_digest, committed, publish
from .hf_cache import sweep_temporaries, temporary_name

__all__ = ["TemporaryBlob", "WritingBlob", "open_writing"]

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


class WritingBlob(ForwardingBlob):
    """A Hub file's blob whose reads are written into a ``TemporaryBlob`` before they
    return (see the module). ``settle`` receives the job that ends the file once the
    blob is closed and no write runs: publish it when read whole, else discard it."""

    def __init__(
        self,
        inner: Blob,
        file: TemporaryBlob,
        lane: Lane,
        settle: Callable[[Callable[[], bool]], None],
    ) -> None:
        super().__init__(inner)
        self._file: TemporaryBlob | None = file
        self._lane = lane
        self._settle = settle
        self._written = RangeSet()
        self._writing = 0  # writes running in the lane (counted on the loop)
        self._failed = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<writing {self.inner!r} written={self._written.total}/{self.size}>"

    async def read_bytes(self, offset: int, length: int) -> bytes:
        data = await self.inner.read_bytes(offset, length)
        await self._write(offset, [memoryview(data)])
        return data

    async def read_into(self, offset: int, buffers: Sequence[memoryview]) -> None:
        await self.inner.read_into(offset, buffers)
        await self._write(offset, clip(buffers, self.size - offset))

    async def _write(self, offset: int, views: list[memoryview]) -> None:
        file = self._file
        if file is None or self._closed or self._failed:
            return
        self._writing += 1
        try:
            await run_blocking(self._lane, lambda: file.write(offset, views))
        except OSError as exc:
            # The bytes are in the caller's buffers already: only the cache gives up.
            file.target.warn(exc)
            self._failed = True
        else:
            self._written.add(offset, offset + sum(v.nbytes for v in views))
        finally:
            self._writing -= 1
            self._end()

    def _end(self) -> None:
        """Hand the file to ``settle`` once closed and no write is running: a write still
        in its thread (its reader was cancelled) must not meet a closed descriptor."""
        file = self._file
        if not self._closed or self._writing or file is None:
            return
        self._file = None
        whole = not self._failed and self._written.covers(0, self.size)
        self._settle(file.publish if whole else file.discard)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.inner.aclose()
        finally:
            self._end()


async def open_writing(
    inner: Blob, target: WeightFile, lane: Lane, submit: Callable[[Callable[[], None]], None]
) -> Blob:
    """``inner`` as a ``WritingBlob`` filling ``target``, its temporary file made in
    ``lane``; ``inner`` itself, with a warning, when the cache cannot take a file.
    ``submit`` runs a job in a commit thread."""
    try:
        file = await run_blocking(
            lane, lambda: TemporaryBlob(target), on_abandon=TemporaryBlob.discard
        )
    except OSError as exc:
        target.warn(exc)
        return inner
    except BaseException:
        await inner.aclose()
        raise
    return WritingBlob(inner, file, lane, lambda end: submit(lambda: target.settle(end)))
