"""The read planner: every selected byte exactly once, reads within bounds."""

from __future__ import annotations

import itertools
import random

import pytest

from aioloader.plan import MAX_PIECES, plan_reads
from aioloader.safetensors import FileHeader, TensorInfo


def _header(sizes: list[int], url: str = "f") -> FileHeader:
    tensors = []
    position = 100
    for i, size in enumerate(sizes):
        tensors.append(TensorInfo(f"t{i}", "U8", (size,), position, position + size))
        position += size
    return FileHeader(url=url, data_start=100, tensors=tuple(tensors))


def _coverage(headers: list[FileHeader], selected: set[str] | None, read_size: int) -> None:
    reads = plan_reads(headers, selected, read_size)
    filled: dict[str, list[tuple[int, int]]] = {}
    for read in reads:
        assert 0 < read.nbytes <= read_size
        assert len(read.pieces) <= MAX_PIECES
        assert read.url == headers[read.file].url
        position = read.start
        for piece in read.pieces:
            assert piece.start == position, "pieces are back to back"
            assert read.start <= piece.start < piece.end <= read.end
            assert piece.tensor.start <= piece.start and piece.end <= piece.tensor.end
            filled.setdefault(f"{read.file}:{piece.tensor.name}", []).append(
                (piece.start, piece.end)
            )
            position = piece.end
        assert position == read.end
    for index, header in enumerate(headers):
        for tensor in header.tensors:
            key = f"{index}:{tensor.name}"
            if (selected is not None and tensor.name not in selected) or tensor.nbytes == 0:
                assert key not in filled
                continue
            spans = sorted(filled[key])
            assert spans[0][0] == tensor.start and spans[-1][1] == tensor.end
            for (_, a_end), (b_start, _) in itertools.pairwise(spans):
                assert a_end == b_start, "no gap, no overlap"


@pytest.mark.parametrize("seed", range(30))
def test_random_layouts(seed: int) -> None:
    rng = random.Random(seed)
    headers = [
        _header(
            [rng.choice([0, 1, 7, 100, 4096, 70_000]) for _ in range(rng.randint(1, 40))], f"f{i}"
        )
        for i in range(rng.randint(1, 3))
    ]
    names = {t.name for h in headers for t in h.tensors}
    selected = None if seed % 3 == 0 else {n for n in names if rng.random() < 0.5}
    _coverage(headers, selected, rng.choice([13, 4096, 65536, 1 << 20]))


def test_big_tensor_is_split() -> None:
    reads = plan_reads([_header([10 * 4096])], None, 4096)
    assert len(reads) == 10
    assert all(r.nbytes == 4096 and len(r.pieces) == 1 for r in reads)


def test_small_neighbours_share_a_read() -> None:
    reads = plan_reads([_header([10] * 100)], None, 4096)
    assert len(reads) == 1 and len(reads[0].pieces) == 100


def test_unselected_tensor_breaks_the_run() -> None:
    reads = plan_reads([_header([10, 10, 10])], {"t0", "t2"}, 4096)
    assert [(r.start, r.end) for r in reads] == [(100, 110), (120, 130)]


def test_piece_cap() -> None:
    reads = plan_reads([_header([1] * (MAX_PIECES * 2 + 3))], None, 1 << 20)
    assert [len(r.pieces) for r in reads] == [MAX_PIECES, MAX_PIECES, 3]
