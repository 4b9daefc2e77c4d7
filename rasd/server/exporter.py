"""The daemon's metrics on ``metrics_port``: its counters, latencies and gauges.

Everything the exporter reads is the router's (``rasd.server.routing.Router``): the counters,
the latency histograms, the pools' metrics, the in-flight gate, ``up``, and once up the
coordinator's cache and prefetcher. ``rasd.observe.prom`` turns them into metric families
when scraped and serves them from a thread, so each gauge only reads.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import __version__
from ..observe.prom import Gauge, MetricsServer, build_registry, start_http
from .routing import Router


def serve(port: int, router: Router) -> MetricsServer:
    """Serve the daemon's metrics on ``port`` (loopback; prometheus_client is imported now)."""
    up = router.up
    guard = router.clock_guard

    def cache_leases() -> int:
        return router.serving.cache.size() if up.is_set() else 0

    def prefetch() -> dict[str, int]:
        if not up.is_set():
            return {}
        bufs = router.serving.coordinator.prefetch.buffers
        return {f"{c}/{p}": len(b) for (c, p), b in bufs.items()}

    def hit_table(field: str) -> Callable[[], int]:
        def read() -> int:
            published = router.serving.cache.published if up.is_set() else None
            return published.stats()[field] if published is not None else 0

        return read

    def claimable() -> dict[tuple[str, str], int]:
        if not up.is_set():
            return {}
        return {k: len(b) for k, b in list(router.serving.coordinator.prefetch.buffers.items())}

    registry = build_registry(
        router.counters,
        router.latency,
        {
            "cache_leases": Gauge("Leases in the daemon's cache", cache_leases),
            "prefetch_candidates": Gauge("Prefetched claim candidates per pool", prefetch),
            "up": Gauge(
                "1 once DynamoDB answered and pools are loaded, 0 while starting or degraded",
                lambda: int(up.is_set()),
            ),
            "inflight": Gauge("Requests doing DynamoDB work", lambda: router.gate.inflight),
            "hit_table_entries": Gauge(
                "Answers published in the hit tables (shared memory the clients read)",
                hit_table("entries"),
            ),
            "hit_table_evictions": Gauge(
                "Answers given up since start for want of a free slot in their bucket "
                "(answered over the socket instead; grows steadily: raise hit_table_slots)",
                hit_table("evictions"),
            ),
            "clock_trusted": Gauge(
                "1 while this host's clock is trusted within half of max_clock_skew, 0 while "
                "the daemon refuses for it (rasd_clock_* and the clock_untrusted log say why)",
                lambda: int(guard.why is None),
            ),
            "clock_offset_floor_seconds": Gauge(
                "How far this host's clock was at least from DynamoDB's at the last answer "
                "(its Date header; positive: ahead; 0: within what the reading can tell)",
                lambda: (guard.date_floor_us or 0) / 1e6,
            ),
            "clock_kernel_maxerror_seconds": Gauge(
                "This host's clock error bound, ClockBound's where it runs, else the kernel's "
                "(clock_check = kernel)",
                lambda: guard.kernel.maxerror_us / 1e6 if guard.kernel is not None else 0.0,
            ),
        },
        version=__version__,
        pools=router.pool_metrics,
        claimable=claimable,
    )
    return start_http(port, registry=registry)
