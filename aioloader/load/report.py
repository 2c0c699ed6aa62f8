"""What a load did, measured: sizes, phases, throughput and the settings used."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..redact import redact
from ..settings.values import format_size

if TYPE_CHECKING:
    from ..sources.base import Blob

__all__ = ["LoadReport", "cache_outcome"]


def cache_outcome(blobs: Iterable[Blob]) -> str | None:
    """What the node cache did for a load's files: ``"hit"`` (every file from the cache),
    ``"miss"`` (none), ``"partial"`` (some), or None when no file went through a cache.

    A blob opened through the cache says which it was in its ``cache_outcome`` (a hit
    reads the cached copy, a miss fills it); others say None.
    """
    outcomes = [blob.cache_outcome for blob in blobs]
    if not any(outcomes):
        return None
    if all(o == "hit" for o in outcomes):
        return "hit"
    return "partial" if "hit" in outcomes else "miss"


@dataclass(frozen=True)
class LoadReport:
    """The outcome of one load.

    Attributes:
        url: what was loaded, its secrets redacted (user info, query values).
        device: where the tensors were put.
        files: safetensors files read.
        tensors: tensors returned.
        bytes: tensor bytes read.
        header_seconds: opening files and parsing headers.
        read_seconds: from the first data read to the last one landing.
        copy_seconds: time spent moving staged bytes to the device (0 for host
            memory, whose reads land in place).
        total_seconds: the whole load, wall clock.
        peak_staging_bytes: the most bytes in flight and in staging at once.
        settings: concurrency, chunk_size and memory_limit as used.
        own_bytes: with ``group=``, the bytes this rank read from the source itself
            (the rest came from the other ranks); None otherwise.
        cache: what the node cache did: ``"hit"`` (every file read from it),
            ``"miss"`` (every file downloaded), ``"partial"`` (some of each); None
            without a cache (see ``cache_outcome``).
    """

    url: str
    device: str
    files: int
    tensors: int
    bytes: int
    header_seconds: float
    read_seconds: float
    copy_seconds: float
    total_seconds: float
    peak_staging_bytes: int
    settings: dict[str, int] = field(default_factory=dict)
    own_bytes: int | None = None
    cache: str | None = None

    def __post_init__(self) -> None:
        # A report is logged and printed: a presigned URL's signature must not be.
        object.__setattr__(self, "url", redact(self.url))

    @property
    def overlap(self) -> float:
        """Share of the shorter phase (read or copy) hidden behind the longer one, 0 to 1."""
        data_phase = self.total_seconds - self.header_seconds
        shorter = min(self.read_seconds, self.copy_seconds)
        if shorter <= 0:
            return 1.0
        hidden = self.read_seconds + self.copy_seconds - data_phase
        return max(0.0, min(1.0, hidden / shorter))

    @property
    def bottleneck(self) -> str:
        """``"storage"`` when reading took longest, ``"copy"`` when moving to the device did."""
        return "copy" if self.copy_seconds > self.read_seconds else "storage"

    def advice(self) -> str:
        """What the bottleneck means for the user, in a sentence."""
        if self.bottleneck == "copy":
            return (
                "copying to the device took longer than reading: the host-to-device link "
                "(PCIe) or pinned host memory is the limit; more concurrency will not help"
            )
        return (
            "reading took longest: storage (disk or network) is the limit; if raising "
            "concurrency does not raise the throughput, the storage is at its ceiling"
        )

    @property
    def throughput(self) -> float:
        """Bytes per second over the whole load."""
        return self.bytes / self.total_seconds if self.total_seconds > 0 else 0.0

    def summary(self) -> str:
        """One line, starting ``Loading weights took``, for logs and terminals."""
        s = self.settings
        own = f", read {format_size(self.own_bytes)} itself" if self.own_bytes is not None else ""
        cache = f" (node cache: {self.cache})" if self.cache is not None else ""
        return (
            f"Loading weights took {self.total_seconds:.2f} s: {format_size(self.bytes)} in "
            f"{self.tensors} tensors from {self.files} file{'s' if self.files != 1 else ''} "
            f"to {self.device} at {self.throughput / 1e9:.2f} GB/s "
            f"(header {self.header_seconds:.3f} s, read {self.read_seconds:.2f} s, "
            f"copy {self.copy_seconds:.2f} s; concurrency={s.get('concurrency')} "
            f"chunk_size={format_size(s.get('chunk_size', 0))} "
            f"memory_limit={format_size(s.get('memory_limit', 0))}, "
            f"peak staging {format_size(self.peak_staging_bytes)}, bottleneck {self.bottleneck}"
            f"{f', overlap {self.overlap:.0%}' if self.copy_seconds else ''}"
            f"{own}) from {self.url}{cache}"
        )

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["throughput_bytes_per_second"] = self.throughput
        data["overlap"] = self.overlap
        data["bottleneck"] = self.bottleneck
        return data
