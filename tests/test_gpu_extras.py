"""CuPy per CUDA major: the extras, and the refusal of a CuPy whose CUDA is not torch's.

The check's decision is a pure function of two CUDA versions, tested here on the CPU;
CupyEngine applies it to CuPy's runtime version and ``torch.version.cuda``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from aioloader.devices.cuda_versions import (
    GPU_EXTRAS,
    cuda_major,
    cuda_mismatch,
    cupy_install,
    runtime_version,
)

ROOT = Path(__file__).resolve().parent.parent


def _extras() -> dict[str, list[Requirement]]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        name: [Requirement(given) for given in requirements]
        for name, requirements in extras["optional-dependencies"].items()
    }


@pytest.mark.parametrize(("number", "text"), [(12080, "12.8"), (13000, "13.0"), (12040, "12.4")])
def test_runtime_version_is_written_as_torch_writes_it(number: int, text: str) -> None:
    assert runtime_version(number) == text
    assert cuda_major(text) == number // 1000


@pytest.mark.parametrize(
    ("cupy", "torch"), [("12.8", "12.4"), ("13.0", "13.0"), ("12.8", None), ("13.0", None)]
)
def test_cupy_and_torch_of_one_cuda_major_agree(cupy: str, torch: str | None) -> None:
    assert cuda_mismatch(cupy, torch) is None


def test_cupy_for_cuda_12_beside_torch_for_cuda_13_names_the_cuda_13_extra() -> None:
    reason = cuda_mismatch("12.8", "13.0")
    assert reason is not None
    assert "CUDA 12" in reason and "CUDA 13.0" in reason
    assert "pip uninstall cupy-cuda12x" in reason
    assert "pip install 'aioloader[gpu-cuda13]'" in reason


def test_cupy_for_cuda_13_beside_torch_for_cuda_12_names_the_cuda_12_extra() -> None:
    reason = cuda_mismatch("13.0", "12.8")
    assert reason is not None
    assert "pip uninstall cupy-cuda13x" in reason
    assert "pip install 'aioloader[gpu-cuda12]'" in reason


def test_a_cuda_major_without_an_extra_names_cupys_own_package() -> None:
    reason = cuda_mismatch("12.8", "11.8")
    assert reason is not None and "pip install 'cupy-cuda11x'" in reason


@pytest.mark.parametrize("bad", ["", "cu130", "twelve"])
def test_a_cuda_version_that_is_none_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a CUDA version"):
        cuda_major(bad)


def test_every_cuda_major_has_its_extra_with_its_cupy() -> None:
    extras = _extras()
    for major, name in GPU_EXTRAS.items():
        (requirement,) = extras[name]
        assert requirement.name == f"cupy-cuda{major}x", name
        assert cupy_install(major) == f"pip install 'aioloader[{name}]'"
    # `gpu`, as installs have named it, is CUDA 12's.
    (gpu,) = extras["gpu"]
    assert gpu.name == "aioloader" and gpu.extras == {GPU_EXTRAS[12]}
    others = [r for name, rs in extras.items() if name not in GPU_EXTRAS.values() for r in rs]
    assert not [r for r in others if r.name.startswith("cupy-")], "CuPy only in gpu-cudaN"


def test_docs_name_the_extra_of_each_cuda_major() -> None:
    for path in (ROOT / "README.md", ROOT / "docs" / "gpu.md"):
        text = path.read_text()
        for major, name in GPU_EXTRAS.items():
            assert re.search(rf"`{name}`[^.]*CUDA {major}", text), (path, name)
