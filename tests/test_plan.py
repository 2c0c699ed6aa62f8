"""The read planner: every selected byte exactly once, reads aligned and within bounds."""

from __future__ import annotations

import itertools
import random

import pytest

from aioloader.format.safetensors import FileHeader, TensorInfo
from aioloader.reads.plan import ALIGNMENT, SPAN_TENSORS, plan_reads


def _header(sizes: list[int], url: str = "f", data_start: int = 100) -> FileHeader:
    tensors = []
    position = data_start
    for i, size in enumerate(sizes):
        tensors.append(TensorInfo(f"t{i}", "U8", (size,), position, position + size))
        position += size
    return FileHeader(url=url, data_start=data_start, tensors=tuple(tensors))


def _check(headers: list[FileHeader], selected: set[str] | None, read_size: int) -> None:
    spans, reads = plan_reads(headers, selected, read_size)
    step = max(ALIGNMENT, read_size - read_size % ALIGNMENT)
    covered: dict[int, list[tuple[int, int]]] = {}
    for read in reads:
        assert read.start % ALIGNMENT == 0 and read.end % ALIGNMENT == 0
        assert 0 < read.nbytes <= step
        assert read.span.start <= read.start < read.end <= read.span.end
        covered.setdefault(read.span.file, []).append((read.start, read.end))
        for tensor in read.tensors:
            assert tensor.start < read.end and tensor.end > read.start, "listed tensors overlap"
        for tensor in read.span.tensors:
            overlaps = tensor.start < read.end and tensor.end > read.start
            assert overlaps == (tensor in read.tensors)
    for _file, ranges in covered.items():
        ranges.sort()
        for (_, a_end), (b_start, _) in itertools.pairwise(ranges):
            assert a_end <= b_start, "reads never overlap: no byte is written twice"
    wanted = {
        (i, t.name)
        for i, h in enumerate(headers)
        for t in h.tensors
        if t.nbytes and (selected is None or t.name in selected)
    }
    in_spans = {(s.file, t.name) for s in spans for t in s.tensors}
    assert in_spans == wanted
    for span in spans:
        for tensor in span.tensors:
            assert span.start <= tensor.start and tensor.end <= span.end
            inside = [r for r in reads if r.span is span and tensor in r.tensors]
            assert inside[0].start <= tensor.start and inside[-1].end >= tensor.end
            for a, b in itertools.pairwise(inside):
                assert a.end == b.start, "a tensor's reads are back to back"


@pytest.mark.parametrize("seed", range(40))
def test_random_layouts(seed: int) -> None:
    rng = random.Random(seed)
    headers = [
        _header(
            [rng.choice([0, 1, 7, 100, 4096, 70_000]) for _ in range(rng.randint(1, 40))],
            f"f{i}",
            rng.choice([8, 100, 4096, 5000]),
        )
        for i in range(rng.randint(1, 3))
    ]
    names = {t.name for h in headers for t in h.tensors}
    selected = None if seed % 3 == 0 else {n for n in names if rng.random() < 0.5}
    _check(headers, selected, rng.choice([1, 4096, 10_000, 65536, 1 << 20]))


def test_big_tensor_is_split_into_parallel_reads() -> None:
    spans, reads = plan_reads([_header([10 * ALIGNMENT], data_start=ALIGNMENT)], None, ALIGNMENT)
    assert len(spans) == 1 and len(reads) == 10
    assert all(r.nbytes == ALIGNMENT and len(r.tensors) == 1 for r in reads)


def test_small_neighbours_share_a_read() -> None:
    _, reads = plan_reads([_header([10] * 100)], None, 1 << 20)
    assert len(reads) == 1 and len(reads[0].tensors) == 100


def test_far_apart_selection_makes_separate_spans() -> None:
    header = _header([10, 100_000, 10])
    spans, reads = plan_reads([header], {"t0", "t2"}, 1 << 20)
    assert [[t.name for t in s.tensors] for s in spans] == [["t0"], ["t2"]]
    assert sum(r.nbytes for r in reads) == 2 * ALIGNMENT  # the unselected middle is not read


def test_many_small_tensors_make_spans_of_bounded_size() -> None:
    """A device makes a span's tensors at once, and a read's tensors are handed out at
    once, both on the event loop: 300,000 tensors in one span held it for seconds."""
    header = _header([12] * (3 * SPAN_TENSORS + 5))  # 12 bytes: few aligned boundaries
    spans, reads = plan_reads([header], None, 16 << 20)
    assert [len(s.tensors) for s in spans] == [SPAN_TENSORS] * 3 + [5]
    assert [t for s in spans for t in s.tensors] == list(header.tensors)
    assert all(len(r.tensors) <= SPAN_TENSORS for r in reads)
    for a, b in itertools.pairwise(spans):
        # Neighbours share at most the block a cut falls in; each reads its own copy.
        assert a.end - ALIGNMENT <= b.start <= a.end
    for span in spans:
        mine = [r for r in reads if r.span is span]
        assert mine[0].start == span.start and mine[-1].end == span.end
        for a, b in itertools.pairwise(mine):
            assert a.end == b.start, "a span's reads never overlap"
