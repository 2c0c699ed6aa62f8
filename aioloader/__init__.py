"""aioloader: stream safetensors weights into memory as fast as the storage allows.

>>> tensors = await aioloader.load_model("/models/llama")          # doctest: +SKIP

Importing this package is cheap: torch and other heavy dependencies are imported
where they are first used.
"""

from __future__ import annotations

from .api import (
    Loader,
    LoaderStatistics,
    ModelInfo,
    StreamStatistics,
    TensorStream,
    inspect_model,
    load_model,
    load_model_sync,
    wait_hf_cache,
)
from .cache import CachedModel, ModelCache
from .config import HttpOptions, Limits, S3Options
from .errors import (
    AccessDeniedError,
    CacheError,
    ClosedError,
    ConfigError,
    DigestMismatchError,
    DistributedError,
    EventLoopError,
    FormatError,
    HeaderError,
    LoaderError,
    NotFoundError,
    ObjectChangedError,
    OutOfMemoryError,
    ReadError,
    ReadTimeoutError,
    SelectionError,
    SourceError,
    UnsupportedFormatError,
)
from .options import LoadOptions
from .report import LoadReport
from .rows import split_rows
from .safetensors import FileHeader, TensorInfo

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "CacheError",
    "CachedModel",
    "ClosedError",
    "ConfigError",
    "DigestMismatchError",
    "DistributedError",
    "EventLoopError",
    "FileHeader",
    "FormatError",
    "HeaderError",
    "HttpOptions",
    "Limits",
    "LoadOptions",
    "LoadReport",
    "Loader",
    "LoaderError",
    "LoaderStatistics",
    "ModelCache",
    "ModelInfo",
    "NotFoundError",
    "ObjectChangedError",
    "OutOfMemoryError",
    "ReadError",
    "ReadTimeoutError",
    "S3Options",
    "SelectionError",
    "SourceError",
    "StreamStatistics",
    "TensorInfo",
    "TensorStream",
    "UnsupportedFormatError",
    "__version__",
    "inspect_model",
    "load_model",
    "load_model_sync",
    "split_rows",
    "wait_hf_cache",
]
