"""The exceptions aioloader raises.

Every error names what failed (URL, file, tensor, byte range) and says what to
do about it. The tree is shallow on purpose::

    LoaderError
    ├── ConfigError (ValueError)          a setting or argument is wrong
    ├── SourceError                       the storage could not be reached or read
    │   ├── NotFoundError (FileNotFoundError)
    │   ├── AccessDeniedError (PermissionError)
    │   ├── ObjectChangedError            the file changed on the server mid-load
    │   ├── DigestMismatchError           the bytes read are not the ones the publisher hashed
    │   └── ReadError                     a byte range failed mid-load
    │       └── ReadTimeoutError (TimeoutError)
    ├── FormatError (ValueError)          the bytes are not a valid safetensors model
    │   ├── HeaderError                   the header is malformed or inconsistent
    │   └── UnsupportedFormatError        a pickle/.bin, GGUF, LFS pointer, ...
    ├── SelectionError (KeyError)         asked for tensors the model does not have
    ├── OutOfMemoryError (MemoryError)    a tensor does not fit in the memory there is
    ├── CacheError                        the local model cache cannot be written or used
    ├── DistributedError                  another rank failed, or the ranks disagree
    ├── StartupError                      the preload daemon cannot start
    ├── EventLoopError (RuntimeError)     a blocking call on a running event loop's thread
    └── ClosedError (RuntimeError)        the Loader was used after aclose()

``asyncio.CancelledError`` is never wrapped: cancelling a load cancels it.

Every message is redacted as the error is made (see ``redact.py``): the secrets of
the URLs in it (presigned query strings, user info) never reach ``str(error)``.
Attributes such as ``ReadError.url`` keep the URL as given, for programs.
"""

from __future__ import annotations

from .redact import redact

__all__ = [
    "AccessDeniedError",
    "CacheError",
    "ClosedError",
    "ConfigError",
    "DigestMismatchError",
    "DistributedError",
    "EventLoopError",
    "FormatError",
    "HeaderError",
    "LoaderError",
    "NotFoundError",
    "ObjectChangedError",
    "OutOfMemoryError",
    "ReadError",
    "ReadTimeoutError",
    "SelectionError",
    "SourceError",
    "StartupError",
    "UnsupportedFormatError",
]


class LoaderError(Exception):
    """Base class of every error aioloader raises on purpose."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ConfigError(LoaderError, ValueError):
    """A setting or argument is invalid, or not allowed on this machine."""


class SourceError(LoaderError):
    """The storage holding the weights could not be listed, opened or read."""


class NotFoundError(SourceError, FileNotFoundError):
    """A file, shard or object does not exist."""


class AccessDeniedError(SourceError, PermissionError):
    """The storage refused access to a file or object."""


class ObjectChangedError(SourceError):
    """A remote object (new ETag or size) or a local file (new size, inode or times)
    changed after the load started.

    Tensors from two versions of a file are never mixed: the load fails instead.
    """


class DigestMismatchError(SourceError):
    """A file read whole does not hash to the digest its publisher gives for it (the
    Hub's LFS sha256 or git blob id, S3's full-object checksum): it was corrupted
    between the storage and this process. Raised before a load returns or a fetch
    commits the file; a stream has already handed out the file's tensors by then.

    Attributes:
        url: the file.
        algorithm: ``"sha256"``, ``"sha1"`` (a git blob id), ``"crc32"``, ...
        expected: the digest published, as published.
        actual: the digest of the bytes read, in the same form.
    """

    def __init__(self, message: str, *, url: str, algorithm: str, expected: str, actual: str):
        super().__init__(message)
        self.url = url
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual


class ReadError(SourceError):
    """A byte range could not be read in full.

    Attributes:
        url: the file or object being read.
        start: first byte of the failed range (absolute file offset).
        end: one past the last byte of the failed range.
        tensors: names of the tensors whose bytes lie in that range.
    """

    def __init__(
        self, message: str, *, url: str, start: int, end: int, tensors: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.url = url
        self.start = start
        self.end = end
        self.tensors = tensors


class ReadTimeoutError(ReadError, TimeoutError):
    """A transfer stalled longer than the stall timeout on every attempt."""


class FormatError(LoaderError, ValueError):
    """The bytes are not a loadable safetensors model."""


class HeaderError(FormatError):
    """A safetensors header is malformed or inconsistent with the file."""


class UnsupportedFormatError(FormatError):
    """The file is a known format that is not safetensors."""


class SelectionError(LoaderError, KeyError):
    """Tensors were requested that the model does not contain."""

    def __str__(self) -> str:
        # KeyError.__str__ quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""


class OutOfMemoryError(LoaderError, MemoryError):
    """The tensors to load do not fit in the memory where they go: one larger than all
    the memory this process may use is refused before anything is allocated, and an
    allocation that fails is said naming the file, the tensor and its size."""


class CacheError(LoaderError):
    """The local model cache (``cache_dir``) cannot be written or used.

    The message names the cache directory and what to do (free space, fix the
    permissions, point ``AIOLOADER_CACHE_DIR`` elsewhere, or pass ``cache_dir=False``).
    A failed write never leaves an entry marked complete.
    """


class DistributedError(LoaderError):
    """Another rank of the group failed, or the ranks disagree on what to load."""


class StartupError(LoaderError):
    """The daemon cannot start; the message says why and what to do."""


class EventLoopError(LoaderError, RuntimeError):
    """A blocking call (``load_model_sync``) was made on the thread of a running event
    loop, which it would block; ``await`` the async form there instead."""


class ClosedError(LoaderError, RuntimeError):
    """A Loader (or stream) was used after it was closed."""
