"""The one table of safetensors dtypes: element size, and the torch and NumPy names."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import ConfigError, FormatError

__all__ = ["DTYPES", "DTYPE_SIZES", "Dtype", "import_torch", "numpy_dtype", "torch_dtype"]


class Dtype(NamedTuple):
    """A safetensors dtype: bytes per element, and its name in torch and in NumPy/CuPy
    (``None`` where that framework has no such type)."""

    size: int
    torch: str
    numpy: str | None


# Every dtype the format defines that torch can hold.
DTYPES: dict[str, Dtype] = {
    "F64": Dtype(8, "float64", "float64"),
    "F32": Dtype(4, "float32", "float32"),
    "F16": Dtype(2, "float16", "float16"),
    "BF16": Dtype(2, "bfloat16", None),
    "I64": Dtype(8, "int64", "int64"),
    "I32": Dtype(4, "int32", "int32"),
    "I16": Dtype(2, "int16", "int16"),
    "I8": Dtype(1, "int8", "int8"),
    "U64": Dtype(8, "uint64", "uint64"),
    "U32": Dtype(4, "uint32", "uint32"),
    "U16": Dtype(2, "uint16", "uint16"),
    "U8": Dtype(1, "uint8", "uint8"),
    "BOOL": Dtype(1, "bool", "bool"),
    "C64": Dtype(8, "complex64", "complex64"),
    "F8_E4M3": Dtype(1, "float8_e4m3fn", None),
    "F8_E4M3FNUZ": Dtype(1, "float8_e4m3fnuz", None),
    "F8_E5M2": Dtype(1, "float8_e5m2", None),
    "F8_E5M2FNUZ": Dtype(1, "float8_e5m2fnuz", None),
    "F8_E8M0": Dtype(1, "float8_e8m0fnu", None),
}

#: Bytes per element of each dtype.
DTYPE_SIZES: dict[str, int] = {name: d.size for name, d in DTYPES.items()}

_TORCH_DTYPES: dict[str, Any] = {}


def import_torch() -> Any:
    """The torch module, imported on first use: torch is an extra, not a dependency.

    Raises:
        ConfigError: torch is not installed (the daemon, the node cache and
            ``framework="numpy"`` loads run without it).
    """
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ConfigError(
            'framework="torch" needs torch, which is not installed: pip install '
            '"aioloader[torch]" (or torch itself), or load with framework="numpy"'
        ) from None
    return torch


def torch_dtype(dtype: str, *, tensor: str = "") -> Any:
    """The torch dtype for a safetensors dtype string.

    Raises:
        FormatError: this torch build has no such dtype.
    """
    found = _TORCH_DTYPES.get(dtype)
    if found is not None:
        return found
    torch = import_torch()

    entry = DTYPES.get(dtype)
    found = getattr(torch, entry.torch, None) if entry is not None else None
    if found is None:
        raise FormatError(
            f"tensor {tensor!r}: dtype {dtype} has no equivalent in torch {torch.__version__}; "
            "upgrade torch or select other tensors"
        )
    _TORCH_DTYPES[dtype] = found  # looked up once: a model may hold 300,000 tensors
    return found


def numpy_dtype(dtype: str, *, tensor: str = "", framework: str = "NumPy") -> Any:
    """The NumPy (and CuPy) dtype for a safetensors dtype string.

    Raises:
        FormatError: NumPy has no such type (BF16, the F8 types).
    """
    import numpy as np

    entry = DTYPES.get(dtype)
    if entry is None or entry.numpy is None:
        raise FormatError(
            f"tensor {tensor!r} is {dtype}, which {framework} arrays cannot hold; "
            "load it with framework='torch' or select other tensors"
        )
    return np.dtype(entry.numpy)
