"""torch is an extra: the daemon, the node cache and numpy loads run without it.

The end-to-end test runs in ``.venv-notorch`` (aioloader with only the daemon extra,
made by scripts/notorch_setup.sh; CI makes it) and is skipped where that venv is
absent. The checks above it run in the test venv, with torch hidden.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import aioloader
from aioloader.cli import main
from aioloader.errors import ConfigError

from .daemon_helpers import Daemon
from .servers import FaultyHttpServer

ROOT = Path(__file__).resolve().parent.parent
NOTORCH = ROOT / ".venv-notorch" / "bin"

# Run in .venv-notorch: fetch a model into a node cache and load a local file as numpy,
# then prove torch was never needed (nor importable).
_CHILD = """
import asyncio, sys
import numpy as np
import aioloader

async def main(url, cache, local, out):
    await aioloader.ModelCache(cache).fetch(url)
    arrays = await aioloader.load_model(local, framework="numpy")
    np.savez(out, **arrays)

asyncio.run(main(*sys.argv[1:]))
assert "torch" not in sys.modules, "torch was imported"
try:
    import torch  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("torch is installed in this venv")
"""


def _write_model(folder: Path) -> Path:
    """A two-shard indexed model, written with safetensors' numpy API (no torch)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    weight_map = {}
    for s in range(2):
        name = f"model-{s + 1:05d}-of-00002.safetensors"
        tensors = {
            f"layer.{s}.weight": rng.standard_normal((64, 256), dtype=np.float32),
            f"layer.{s}.bias": np.arange(256, dtype=np.int64),
        }
        save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


class _NoTorchDaemon(Daemon):
    """``aioloader serve`` from .venv-notorch's own entry point."""

    def command(self) -> list[str]:
        serve = ["serve", "--port", str(self.port), "--cache-dir", str(self.cache_dir)]
        return [str(NOTORCH / "aioloader"), *serve, *self.args]


@pytest.fixture
def notorch() -> Path:
    if not (NOTORCH / "python").exists():
        pytest.skip(".venv-notorch is absent: make it with scripts/notorch_setup.sh (CI does)")
    return NOTORCH


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"aioloader {aioloader.__version__}"


def test_torch_missing_says_which_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aioloader.format.dtypes import import_torch

    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(3, dtype=np.float32)}, str(path))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as if absent
    with pytest.raises(ConfigError, match=r"aioloader\[torch\]"):
        import_torch()
    assert main(["load", str(path)]) == 1
    err = capsys.readouterr().err
    assert 'aioloader: error: framework="torch" needs torch' in err
    assert "Traceback" not in err
    assert main(["load", "--framework", "numpy", str(path)]) == 0


def test_daemon_cache_and_numpy_without_torch(
    notorch: Path, http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    index = _write_model(http_server.root / "m")
    url = http_server.url_for("m/model.safetensors.index.json")
    cache = tmp_path / "cache"

    daemon = _NoTorchDaemon(cache, "--model", url).start()
    try:
        daemon.wait_ready(30)
        status, body = daemon.get("/ready")
        assert status == 200, body
        assert daemon.get("/health")[0] == 200
    finally:
        assert daemon.stop() == 0, daemon.output()
    assert "torch" not in daemon.output()

    verify = subprocess.run(
        [str(notorch / "aioloader"), "cache", "verify", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.count("ok ") == 3, verify.stdout  # the index and 2 shards
    assert "3 file(s) checked, 0 bad" in verify.stderr

    local = index.parent / "model-00001-of-00002.safetensors"
    out = tmp_path / "arrays.npz"
    child = subprocess.run(
        [
            str(notorch / "python"),
            "-c",
            _CHILD,
            url,
            str(tmp_path / "cache2"),
            str(local),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert len(list((tmp_path / "cache2").glob("entries/*/data"))) == 3
    reference = load_file(str(local))
    with np.load(out) as got:
        assert sorted(got.files) == sorted(reference)
        for name, array in reference.items():
            assert got[name].dtype == array.dtype and got[name].tobytes() == array.tobytes()
