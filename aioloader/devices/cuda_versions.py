"""Which CUDA CuPy and torch are built for, and the extra that makes them agree (pure).

CuPy's wheels are built for one CUDA major each (``cupy-cuda12x``, ``cupy-cuda13x``),
as torch's are (``torch.version.cuda``: ``"12.8"``, ``"13.0"``). Two majors in one
process mean two CUDA runtimes: the second one's libraries are often missing, and
when present its memory and streams are not the first one's.
"""

from __future__ import annotations

__all__ = ["GPU_EXTRAS", "cuda_major", "cuda_mismatch", "cupy_install", "runtime_version"]

GPU_EXTRAS = {12: "gpu-cuda12", 13: "gpu-cuda13"}
"""aioloader's extra for each CUDA major it has one for (pyproject.toml; ``gpu`` is 12's)."""


def runtime_version(number: int) -> str:
    """CUDA's integer version (``cudaRuntimeGetVersion``: 12080) as torch writes it: 12.8."""
    return f"{number // 1000}.{number % 1000 // 10}"


def cuda_major(version: str) -> int:
    """The major of a CUDA version written as torch does (``"13.0"``: 13).

    Raises:
        ValueError: not a CUDA version.
    """
    major = version.strip().partition(".")[0]
    if not major.isdigit():
        raise ValueError(f"not a CUDA version: {version!r}")
    return int(major)


def cupy_install(major: int) -> str:
    """What to install for CuPy built for CUDA ``major``."""
    extra = GPU_EXTRAS.get(major)
    if extra is None:
        return f"pip install 'cupy-cuda{major}x'"
    return f"pip install 'aioloader[{extra}]'"


def cuda_mismatch(cupy_cuda: str, torch_cuda: str | None) -> str | None:
    """Why CuPy (built for CUDA ``cupy_cuda``) and torch (``torch.version.cuda``: None
    for a CPU build) cannot share a process, and what to install instead; None when their
    CUDA majors agree or torch has no CUDA."""
    if torch_cuda is None:
        return None
    cupy_major, torch_major = cuda_major(cupy_cuda), cuda_major(torch_cuda)
    if cupy_major == torch_major:
        return None
    return (
        f"CuPy is built for CUDA {cupy_major} (cupy-cuda{cupy_major}x, CUDA {cupy_cuda}) and "
        f"torch, loaded in this process, for CUDA {torch_cuda}: one process cannot use both. "
        f"Install the CuPy of torch's CUDA: pip uninstall cupy-cuda{cupy_major}x && "
        f"{cupy_install(torch_major)}"
    )
