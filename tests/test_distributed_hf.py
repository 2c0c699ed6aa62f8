"""``group=`` with an ``hf://`` model: ranks on one Hub revision share the reads."""

from __future__ import annotations

from pathlib import Path

from .hub_server import LocalHub
from .test_distributed import model, run_ranks


def test_ranks_share_an_hf_model(tmp_path: Path) -> None:
    files = model(tmp_path / "m", shards=2, seed=3)
    with LocalHub(tmp_path / "hub") as hub:
        hub.commit(
            "org/m",
            {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()},
        )
        job = {
            "url": "hf://org/m",
            "files": [str(p) for p in files],
            "env": {
                "HF_ENDPOINT": hub.url,
                "HF_HOME": str(tmp_path / "hf-home"),
                "HF_HUB_CACHE": str(tmp_path / "hf-home" / "hub"),
                "HF_TOKEN_PATH": str(tmp_path / "no-token"),
            },
            "loader": {"chunk_size": "128KiB", "cache_dir": False},
        }
        results = run_ranks(2, job, tmp_path)
        sent = hub.storage.bytes_sent
    assert all(r.get("ok") for r in results), results
    size = sum(p.stat().st_size for p in files)
    # Both ranks read at one commit and the tensor bytes cross the network about once.
    assert sent < size * 1.5, (sent, size)
    own = [r["own_bytes"] for r in results]
    assert all(0.3 < o / results[0]["bytes"] < 0.7 for o in own), own
