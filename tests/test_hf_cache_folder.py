"""A load of one folder of a repository fills the hub cache with that folder only.

``hf://org/name/text_encoder`` reads the weights under ``text_encoder/``; the hub
cache then gets those weights, the small files under that folder (its config) and
the commit's listing and ref, and not the other folders' files, which a process
would otherwise download before it exits. The local Hub (tests/hub_server.py)
records every request; every tensor is compared bit for bit with safetensors.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioloader import Loader
from aioloader.sinks.hf.cache_writes import wait_hf_cache

from . import test_hf
from .helpers import assert_matches_files, write_file
from .hub_server import LocalHub

hub = test_hf.hub  # the local Hub fixture; its hub cache is tmp_path / "hf-cache"
hf = pytest.importorskip("huggingface_hub")

REPO = "org/pipeline"


def _pipeline(tmp_path: Path, hub: LocalHub) -> tuple[str, Path]:
    """A diffusers-like repository: weights and a config in each of two folders, and
    small files of other parts around them."""
    folder = tmp_path / "src"
    for part, seed in (("text_encoder", 1), ("unet", 2)):
        generator = torch.Generator().manual_seed(seed)
        tensors = {f"{part}.w{i}": torch.randn(64, 64, generator=generator) for i in range(4)}
        write_file(folder / part / "model.safetensors", tensors)
        (folder / part / "config.json").write_text(f'{{"part": "{part}"}}')
    for name in ("model_index.json", "README.md", "vae/config.json", "tokenizer/vocab.json",
                 "tokenizer/merges.txt", "scheduler/scheduler_config.json"):  # fmt: skip
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(os.urandom(64 << 10))
    return hub.commit(REPO, test_hf._files(folder)), folder


def _snapshot_files(tmp_path: Path, sha: str) -> set[str]:
    top = tmp_path / "hf-cache" / "models--org--pipeline" / "snapshots" / sha
    return {p.relative_to(top).as_posix() for p in top.rglob("*") if not p.is_dir()}


def _fetched(hub: LocalHub) -> set[str]:
    """The repository paths the Hub was asked to resolve."""
    return {
        r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.log if "/resolve/" in r.path
    }


async def test_a_folder_load_caches_that_folder_only(hub: LocalHub, tmp_path: Path) -> None:
    sha, folder = _pipeline(tmp_path, hub)
    async with Loader() as loader:
        got = await loader.load(f"hf://{REPO}/text_encoder")
        await wait_hf_cache()
        assert_matches_files(got, folder / "text_encoder" / "model.safetensors")
        assert _fetched(hub) == {"text_encoder/model.safetensors", "text_encoder/config.json"}
        assert _snapshot_files(tmp_path, sha) == {
            "text_encoder/model.safetensors",
            "text_encoder/config.json",
        }
        ours = tmp_path / "hf-cache" / "models--org--pipeline"
        assert (ours / "refs" / "main").read_text() == sha
        assert (ours / "trees" / f"{sha}.json").is_file()
        # huggingface_hub reads that folder back offline.
        config = hf.hf_hub_download(
            REPO, "text_encoder/config.json", cache_dir=tmp_path / "hf-cache", local_files_only=True
        )
        assert Path(config).read_bytes() == (folder / "text_encoder" / "config.json").read_bytes()
        # Another folder of the same commit, in the same Loader, brings its own config.
        assert_matches_files(
            await loader.load(f"hf://{REPO}/unet"), folder / "unet" / "model.safetensors"
        )
        await wait_hf_cache()
    assert _snapshot_files(tmp_path, sha) == {
        f"{part}/{name}" for part in ("text_encoder", "unet")
        for name in ("model.safetensors", "config.json")
    }  # fmt: skip
    assert not list((tmp_path / "hf-cache").rglob("*.tmp"))


def test_the_command_line_leaves_the_other_folders_alone(hub: LocalHub, tmp_path: Path) -> None:
    sha, folder = _pipeline(tmp_path, hub)
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "load", f"hf://{REPO}/text_encoder", "--json"],
        capture_output=True, text=True, timeout=120, env=os.environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # What the process wrote before it exited is whole, and is that folder's.
    assert _snapshot_files(tmp_path, sha) == {
        "text_encoder/model.safetensors",
        "text_encoder/config.json",
    }
    cached = tmp_path / "hf-cache" / "models--org--pipeline" / "snapshots" / sha / "text_encoder"
    for name in ("model.safetensors", "config.json"):
        assert (cached / name).read_bytes() == (folder / "text_encoder" / name).read_bytes()
    assert _fetched(hub) == {"text_encoder/model.safetensors", "text_encoder/config.json"}
    half = [p for p in (tmp_path / "hf-cache").rglob("*") if p.suffix in (".tmp", ".incomplete")]
    assert not half, "nothing is left half-written"
