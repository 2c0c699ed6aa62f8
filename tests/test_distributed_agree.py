"""``group=``: ranks that opened different files, or one file at two versions, must
not exchange bytes. Each would otherwise end with torn tensors and no error: the
ranks exchange bytes by position, and these files have one layout.

The real-rank tests spawn two processes over gloo (test_distributed.py's
``run_ranks``); the pure comparison (agreement.py) is tested on its own first.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from aioloader.ranks.agreement import FileIdentity, Status, compare, describe_tables

from .helpers import write_sharded
from .servers import FaultyHttpServer
from .test_distributed import TIMEOUT, model, run_ranks


def twin(folder: Path, shards: int) -> list[Path]:
    """``model(...)``'s layout byte for byte, with other tensor names and dtypes."""
    gen = torch.Generator().manual_seed(7)
    tensors = {
        f"layer.{i:02d}.WEIGHT": torch.randint(-9, 9, (256, 1024), generator=gen, dtype=torch.int32)
        for i in range(12)
    }
    tensors["embed"] = torch.randn(300, 512, generator=gen).to(torch.float16)
    tensors["scale"] = torch.tensor(3, dtype=torch.int64)
    index = write_sharded(folder, tensors, shards=shards)
    return sorted(index.parent.glob("*.safetensors"))


def layout(path: Path) -> list[tuple[int, list[int], list[int]]]:
    """Where each tensor's bytes lie, in file order, and the data's start: what a read plan
    is made of."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    rows = sorted(header.values(), key=lambda t: t["data_offsets"])
    return [(length, t["shape"], t["data_offsets"]) for t in rows]


def failed_named(results: list[dict[str, object]], *needles: str) -> None:
    for r in results:
        error = str(r.get("error"))
        assert "DistributedError" in error, r
        for needle in needles:
            assert needle in error, (needle, r)
        assert float(r["seconds"]) < TIMEOUT, r  # type: ignore[arg-type]


# -- the pure part -------------------------------------------------------------------------


def identity(**changes: object) -> FileIdentity:
    base: dict[str, object] = {
        "url": "http://h/m.safetensors",
        "size": 100,
        "etag": '"a"',
        "last_modified": "Mon, 01 Jan 2024 00:00:00 GMT",
        "local": None,
        "tensors": "t",
    }
    return FileIdentity(**{**base, **changes})  # type: ignore[arg-type]


def test_identical_files_agree() -> None:
    statuses = [Status("m", "p", (identity(),)), Status("m", "p", (identity(),))]
    assert compare(statuses, 0) is None


def test_an_etag_seen_by_one_rank_only_is_not_a_difference() -> None:
    """An edge that sends no ETag says nothing about the version: not a mismatch."""
    statuses = [Status("m", "p", (identity(),)), Status("m", "p", (identity(etag=None),))]
    assert compare(statuses, 0) is None


def test_copies_on_two_machines_are_compared_by_size_and_tensors_only() -> None:
    statuses = [
        Status("a", "p", (identity(etag=None, local=(1, 10, 5)),)),
        Status("b", "p", (identity(etag=None, local=(2, 20, 6)),)),
    ]
    assert compare(statuses, 0) is None


def test_every_difference_of_a_file_is_named_with_its_ranks() -> None:
    statuses = [
        Status("m", "p", (identity(), identity(url="http://h/2"))),
        Status("m", "p", (identity(), identity(url="http://h/2", etag='"b"', size=7))),
        Status("m", "p", (identity(), identity(url="http://h/2", tensors="u"))),
    ]
    verdict = compare(statuses, 1)
    assert verdict is not None and verdict.file == 1
    assert "http://h/2: its size differs (ranks 0, 2: 100 bytes; rank 1: 7 bytes)" in (
        verdict.message
    )
    assert 'its ETag differs (ranks 0, 2: "a"; rank 1: "b")' in verdict.message
    assert "its tensors differ" in verdict.message
    assert "m.safetensors" not in verdict.message  # the file that agrees is not named


def test_last_modified_is_compared_only_without_etags() -> None:
    a = identity(etag=None)
    b = identity(etag=None, last_modified="Tue, 02 Jan 2024 00:00:00 GMT")
    verdict = compare([Status("m", "p", (a,)), Status("m", "p", (b,))], 0)
    assert verdict is not None and "its Last-Modified differs" in verdict.message
    # Two edges that agree on the ETag may stamp different times on the same bytes.
    same = [Status("m", "p", (identity(),)), Status("m", "p", (identity(last_modified="x"),))]
    assert compare(same, 0) is None


def test_a_rank_error_comes_before_any_file_difference() -> None:
    statuses = [Status("m", "p", (identity(),)), Status("m", error="NotFoundError: gone")]
    verdict = compare(statuses, 0)
    assert verdict is not None and "rank 1: NotFoundError: gone" in verdict.message


def test_different_numbers_of_files_are_named() -> None:
    statuses = [Status("m", "p", (identity(),)), Status("m", "p", (identity(), identity()))]
    verdict = compare(statuses, 0)
    assert verdict is not None and "different numbers of files (rank 0: 1; rank 1: 2)" in (
        verdict.message
    )


def test_the_first_differing_tensor_is_described() -> None:
    a = [("x", "F32", (2, 3), 0, 24), ("y", "F32", (3,), 24, 36)]
    b = [("x", "F32", (2, 3), 0, 24), ("z", "I32", (3,), 24, 36)]
    text = describe_tables([a, b, a])
    assert text == (
        "tensor 2 in file order: ranks 0, 2: 'y' F32 [3] at bytes [24, 36); "
        "rank 1: 'z' I32 [3] at bytes [24, 36)"
    )
    assert "no tensor" in describe_tables([a, a[:1]])


def test_many_differing_files_are_counted() -> None:
    files = tuple(identity(url=f"u{i}") for i in range(7))
    other = tuple(identity(url=f"u{i}", size=1) for i in range(7))
    verdict = compare([Status("m", "p", files), Status("m", "p", other)], 0)
    assert verdict is not None and "and 3 more files" in verdict.message


# -- real ranks ----------------------------------------------------------------------------


def test_ranks_loading_different_files_of_one_layout_all_fail_naming_them(
    tmp_path: Path,
) -> None:
    """Rank 1 loads another model whose tensors have other names and dtypes but lie at
    the same bytes: every rank fails, naming the file and the first tensor apart."""
    ours = model(tmp_path / "a", shards=2)
    theirs = twin(tmp_path / "b", shards=2)
    assert [layout(p) for p in ours] == [layout(p) for p in theirs]  # one read plan
    job = {
        "url": str(tmp_path / "a"),
        "urls": {"1": str(tmp_path / "b")},
        "files": [str(p) for p in ours],
    }
    results = run_ranks(2, job, tmp_path)
    failed_named(
        results,
        "model-00001-of-00002.safetensors",
        "its tensors differ",
        "the ranks on one machine opened different files",
        "'layer.01.weight' F32 [256, 1024]",
        "'layer.01.WEIGHT' I32 [256, 1024]",
    )


def test_ranks_loading_two_copies_with_the_same_tensors_all_fail(tmp_path: Path) -> None:
    """Same names, dtypes and shapes, other bytes: only the files' identity tells."""
    ours = model(tmp_path / "a", shards=2, seed=0)
    model(tmp_path / "b", shards=2, seed=1)
    job = {
        "url": str(tmp_path / "a"),
        "urls": {"1": str(tmp_path / "b")},
        "files": [str(p) for p in ours],
    }
    results = run_ranks(2, job, tmp_path)
    failed_named(results, "the ranks on one machine opened different files", "inode")
    assert "its tensors differ" not in str(results[0]["error"])


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cold-cache"])
def test_ranks_served_two_versions_of_an_http_model_all_fail_naming_the_etags(
    tmp_path: Path, cached: bool
) -> None:
    """Two edges of one CDN mid-rollout: each serves its own version consistently (so
    If-Match never fails), with the same names, dtypes and shapes. Through the node
    cache too, whose blobs carry the version they were opened at."""
    with (
        FaultyHttpServer(tmp_path / "edge-a") as a,
        FaultyHttpServer(tmp_path / "edge-b") as b,
    ):
        files = model(a.root / "m", shards=2, seed=0)
        model(b.root / "m", shards=2, seed=1)
        for name in (p.name for p in files):
            a.set_etag(f"m/{name}", f'"{name}-v1"')
            b.set_etag(f"m/{name}", f'"{name}-v2"')
        job = {
            "url": a.url_for("m/model.safetensors.index.json"),
            "urls": {"1": b.url_for("m/model.safetensors.index.json")},
            "files": [str(p) for p in files],
            "loader": {
                "chunk_size": "128KiB",
                "cache_dir": str(tmp_path / "cache") if cached else False,
            },
        }
        results = run_ranks(2, job, tmp_path)
    failed_named(
        results,
        "model-00001-of-00002.safetensors",
        '"model-00001-of-00002.safetensors-v1"',
        '"model-00001-of-00002.safetensors-v2"',
        "its ETag differs",
    )


def test_ranks_that_see_one_url_change_between_their_probes_all_fail(tmp_path: Path) -> None:
    """One URL, one server, and the object replaced between the two ranks' first requests
    (the ETag changes): both fail before reading, not only the rank whose pin is gone."""
    with FaultyHttpServer(tmp_path / "www") as server:
        files = model(server.root / "m", shards=2)
        server.change_after(f"m/{files[0].name}", requests=1)
        job = {
            "url": server.url_for("m/model.safetensors.index.json"),
            "files": [str(p) for p in files],
            "loader": {"chunk_size": "128KiB", "cache_dir": False},
        }
        results = run_ranks(2, job, tmp_path)
    failed_named(results, files[0].name, "its ETag differs")


@pytest.mark.parametrize("world", [3])
def test_one_rank_of_three_on_another_version_is_named_alone(tmp_path: Path, world: int) -> None:
    ours = model(tmp_path / "a", shards=1, seed=0)
    model(tmp_path / "b", shards=1, seed=1)
    job = {
        "url": str(tmp_path / "a"),
        "urls": {"2": str(tmp_path / "b")},
        "files": [str(p) for p in ours],
    }
    results = run_ranks(world, job, tmp_path)
    failed_named(results, "(ranks 0, 1: inode")
    assert "; rank 2: inode" in str(results[0]["error"])
