"""Prometheus metrics of one daemon, in a registry of its own (never the global one).

No label carries a URL or a message, so none can carry a secret: labels are error
class names (``kind``), HTTP statuses, download outcomes and model statuses.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from .bandwidth import Bandwidth

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Model downloads take from well under a second (cache hit) to tens of minutes.
_LOAD_BUCKETS = (0.05, 0.25, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
# Throughput is averaged over this many seconds.
_RATE_WINDOW = 10.0


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "aioloader serve needs prometheus-client; install aioloader[daemon]"
        ) from None
    return prometheus_client


class Metrics:
    """Counters, gauges and a histogram for /metrics.

    Args:
        cache_statistics: called at each scrape; a mapping (or object) whose
            ``evictions`` field, if any, is exported as a counter.
        bandwidth: the daemon's bandwidth cap (None: no cap), read at each scrape.
    """

    def __init__(
        self,
        cache_statistics: Callable[[], Any] | None = None,
        bandwidth: Bandwidth | None = None,
    ) -> None:
        pc = _prometheus()
        self.registry = pc.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.bytes_fetched = pc.Counter(
            "aioloader_daemon_fetched_bytes",
            "Bytes downloaded from upstream storage into the cache (counted as each fetch ends)",
            registry=r,
        )
        self.load_seconds = pc.Histogram(
            "aioloader_daemon_load_seconds",
            "Seconds from the start of a model's download until it is in the cache",
            ["outcome"],
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.cache_hits = pc.Counter(
            "aioloader_daemon_cache_hits", "Models already complete in the cache", registry=r
        )
        self.cache_misses = pc.Counter(
            "aioloader_daemon_cache_misses", "Models that had to be downloaded", registry=r
        )
        self.in_flight = pc.Gauge(
            "aioloader_daemon_downloads_in_flight", "Model downloads running now", registry=r
        )
        self.errors = pc.Counter(
            "aioloader_daemon_errors",
            "Failed model downloads, by kind of error",
            ["kind"],
            registry=r,
        )
        self.rejected = pc.Counter(
            "aioloader_daemon_rejected_requests",
            "API requests refused, by HTTP status",
            ["status"],
            registry=r,
        )
        self.models = pc.Gauge(
            "aioloader_daemon_models", "Models in the registry, by status", ["status"], registry=r
        )
        self.model_bytes = pc.Counter(
            "aioloader_model_bytes",
            "Bytes of each model put in the cache, by where they came from: the origin "
            "store, or peer daemons over the swarm",
            ["model", "origin"],
            registry=r,
        )
        self.swarm_banned: Callable[[], float] = lambda: 0.0
        r.register(
            _ScrapedCounter(
                "aioloader_swarm_peers_banned",
                "Peers the swarm banned for sending pieces that failed their hash",
                lambda: self.swarm_banned(),
            )
        )
        self._samples: deque[tuple[float, int]] = deque()
        pc.Gauge(
            "aioloader_daemon_throughput_bytes_per_second",
            f"Bytes per second made present in the cache, over the last {_RATE_WINDOW:.0f} s "
            "(bytes a resumed download already had count when it resumes)",
            registry=r,
        ).set_function(self._throughput)
        self._cache_statistics = cache_statistics
        self._evictions = 0
        r.register(
            _ScrapedCounter(
                "aioloader_daemon_cache_evictions", _EVICTIONS_HELP, self._read_evictions
            )
        )
        pc.Gauge(
            "aioloader_daemon_max_bandwidth_bytes_per_second",
            "The daemon's bandwidth cap shared by all its downloads (--max-bandwidth; 0: none)",
            registry=r,
        ).set(bandwidth.rate if bandwidth else 0)
        self._bandwidth = bandwidth
        r.register(
            self._cap_counter(
                "aioloader_daemon_throttled_bytes",
                "Bytes whose read waited for the bandwidth cap",
                "throttled_bytes",
            )
        )
        r.register(
            self._cap_counter(
                "aioloader_daemon_capped_bytes",
                "Bytes read under the bandwidth cap, whether they waited for it or not",
                "capped_bytes",
            )
        )
        r.register(
            self._cap_counter(
                "aioloader_daemon_throttle_wait_seconds",
                "Seconds reads waited for the bandwidth cap, summed over reads",
                "waited_seconds",
            )
        )

    def _cap_counter(self, name: str, text: str, attribute: str) -> _ScrapedCounter:
        def read() -> float:
            if self._bandwidth is None:
                return 0.0
            return float(getattr(self._bandwidth.statistics(), attribute))

        return _ScrapedCounter(name, text, read)

    def progressed(self, nbytes: int) -> None:
        """``nbytes`` more of some model are in the cache (never awaits)."""
        if nbytes <= 0:
            return
        now = time.monotonic()
        self._samples.append((now, nbytes))
        self._trim(now)

    def evicted(self, count: int = 1) -> None:
        """Count models the daemon saw leave the cache."""
        self._evictions += count

    def set_statuses(self, counts: dict[str, int]) -> None:
        for status in ("queued", "downloading", "ready", "failed", "evicted"):
            self.models.labels(status=status).set(counts.get(status, 0))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return bytes(_prometheus().generate_latest(self.registry))

    def _trim(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - _RATE_WINDOW:
            self._samples.popleft()

    def _throughput(self) -> float:
        self._trim(time.monotonic())
        return sum(n for _, n in self._samples) / _RATE_WINDOW

    def _read_evictions(self) -> float:
        if self._cache_statistics is not None:
            stats = self._cache_statistics()
            value = stats.get("evictions") if isinstance(stats, dict) else None
            if value is None:
                value = getattr(stats, "evictions", None)
            if isinstance(value, int | float):
                return float(max(self._evictions, int(value)))
        return float(self._evictions)


class _ScrapedCounter:
    """A counter read at each scrape from whoever keeps the count (the cache, the cap)."""

    def __init__(self, name: str, text: str, read: Callable[[], float]) -> None:
        from prometheus_client.core import CounterMetricFamily

        self._family = CounterMetricFamily
        self._name = name
        self._text = text
        self._read = read

    def describe(self) -> list[Any]:
        return [self._family(self._name, self._text)]

    def collect(self) -> list[Any]:
        family = self._family(self._name, self._text)
        family.add_metric([], self._read())
        return [family]


_EVICTIONS_HELP = "Models the cache evicted to stay under its size limit"
