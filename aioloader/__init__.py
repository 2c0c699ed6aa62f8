"""aioloader: stream safetensors weights into memory as fast as the storage allows.

>>> tensors = await aioloader.load_model("/models/llama")          # doctest: +SKIP

Importing this package is cheap: each public name is imported from its module when it
is first used (``aioloader.ModelCache`` loads the cache, ``aioloader.load_model`` the
loader), and torch and other heavy dependencies are imported where they are first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from .format.safetensors import FileHeader, TensorInfo
    from .load.report import LoadReport
    from .reads.rows import split_rows
    from .settings.options import LoadOptions
    from .settings.values import HttpOptions, Limits, S3Options

__version__ = "0.1.0"

# Where each public name lives: the module is imported the first time the name is asked for.
_HOMES: dict[str, str] = {
    "AccessDeniedError": "errors",
    "CacheError": "errors",
    "CachedModel": "cache",
    "ClosedError": "errors",
    "ConfigError": "errors",
    "DigestMismatchError": "errors",
    "DistributedError": "errors",
    "EventLoopError": "errors",
    "FileHeader": "format.safetensors",
    "FormatError": "errors",
    "HeaderError": "errors",
    "HttpOptions": "settings.values",
    "Limits": "settings.values",
    "LoadOptions": "settings.options",
    "LoadReport": "load.report",
    "Loader": "api",
    "LoaderError": "errors",
    "LoaderStatistics": "api",
    "ModelCache": "cache",
    "ModelInfo": "api",
    "NotFoundError": "errors",
    "ObjectChangedError": "errors",
    "OutOfMemoryError": "errors",
    "ReadError": "errors",
    "ReadTimeoutError": "errors",
    "S3Options": "settings.values",
    "SelectionError": "errors",
    "SourceError": "errors",
    "StreamStatistics": "api",
    "TensorInfo": "format.safetensors",
    "TensorStream": "api",
    "UnsupportedFormatError": "errors",
    "inspect_model": "api",
    "load_model": "api",
    "load_model_sync": "api",
    "split_rows": "reads.rows",
    "wait_hf_cache": "api",
}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
