"""Optional Prometheus exporter: counters, latency histograms and gauges of one daemon.

The hot path bumps plain ints (``Counters.inc``) and :meth:`LatencyHistograms.observe`;
:class:`RasdCollector` builds the families only when scraped, served from a thread
(``start_http``); ``prometheus_client`` is imported lazily (:func:`require`). The names and
the thread rules: docs/operations.md, "Observability".
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from types import ModuleType

    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from .pools import PoolKey, PoolMetrics

#: Request-latency bucket bounds (seconds): a cache hit is ~50-200 us, an existing lease one
#: Query (~2-10 ms), a new lease a few round trips (~10-50 ms); deadlines are ~1 s.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
#: The request paths of get_lease: answered from the cache, an existing lease found in
#: DynamoDB, a new lease claimed.
PATHS: tuple[str, ...] = ("hit", "existing", "new")


class MetricsUnavailable(RuntimeError):
    """Metrics cannot be served: ``prometheus_client`` is not installed, or
    ``metrics_port`` is taken."""


def require() -> ModuleType:
    """``prometheus_client``, or MetricsUnavailable saying how to get it."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise MetricsUnavailable(
            "metrics_port is set but prometheus_client is not installed: "
            "pip install 'rasd[metrics]' (or unset metrics_port)"
        ) from exc
    return prometheus_client


# ------------------------------------------------------------------------------- latencies
class _Hist:
    __slots__ = ("counts", "total")

    def __init__(self, n: int) -> None:
        self.counts = [0] * n
        self.total = 0.0


class LatencyHistograms:
    """Fixed-bucket latency histograms, one per path. ``observe`` is the hot-path call."""

    __slots__ = ("_h", "bounds")

    def __init__(
        self, paths: Sequence[str] = PATHS, bounds: Sequence[float] = DEFAULT_BUCKETS
    ) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("bounds must be a non-empty, strictly increasing sequence")
        self.bounds = tuple(bounds)
        self._h: dict[str, _Hist] = {p: _Hist(len(self.bounds) + 1) for p in paths}

    def observe(self, path: str, seconds: float) -> None:
        """Record one request of ``path`` that took ``seconds`` (bucket ``le`` semantics)."""
        h = self._h.get(path)
        if h is None:
            h = self._h[path] = _Hist(len(self.bounds) + 1)
        h.counts[bisect_left(self.bounds, seconds)] += 1
        h.total += seconds

    def read(self) -> dict[str, tuple[list[int], float]]:
        """Per path: a copy of the per-bucket counts (last one is +Inf) and the sum."""
        return {p: (list(h.counts), h.total) for p, h in list(self._h.items())}

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per path: count, sum and p50/p90/p99 upper bounds (for the ``stats`` op)."""
        out: dict[str, dict[str, float]] = {}
        for path, (counts, total) in self.read().items():
            n = sum(counts)
            row: dict[str, float] = {"count": n, "sum": total}
            for q in (0.5, 0.9, 0.99):
                row[f"p{round(q * 100)}"] = self._quantile(counts, n, q)
            out[path] = row
        return out

    def _quantile(self, counts: list[int], n: int, q: float) -> float:
        if n == 0:
            return 0.0
        rank, seen = q * n, 0
        for i, c in enumerate(counts):
            seen += c
            if seen >= rank:
                return self.bounds[i] if i < len(self.bounds) else float("inf")
        return float("inf")

    def __repr__(self) -> str:
        return f"LatencyHistograms({ {p: sum(h.counts) for p, h in self._h.items()} })"


# -------------------------------------------------------------------------- counter names
_EXACT: dict[str, tuple[str, str, str]] = {
    "cache.hit": ("cache_lookups", "result", "hit"),
    "cache.miss": ("cache_lookups", "result", "miss"),
    "lease.new": ("lease_requests", "outcome", "new"),
    "lease.existing": ("lease_requests", "outcome", "existing"),
    "lease.no_capacity": ("lease_requests", "outcome", "no_capacity"),
    "lease.extended": ("lease_extensions", "result", "ok"),
    "lease.extend_conflicts": ("lease_extensions", "result", "conflict"),
    "lease.extend_skipped": ("lease_extensions", "result", "found_extended"),
    "lease.extend_errors": ("lease_extensions", "result", "error"),
    "lease.reconfirmed": ("lease_confirmations", "result", "ok"),
    "lease.reconfirm_dropped": ("lease_confirmations", "result", "dropped"),
    "lease.reconfirm_errors": ("lease_confirmations", "result", "error"),
    "prefetch.hits": ("prefetch_takes", "result", "hit"),
    "prefetch.misses": ("prefetch_takes", "result", "miss"),
}
_PREFIX: dict[str, tuple[str, str]] = {
    "shed.": ("shed_requests", "reason"),
    "err.": ("request_errors", "code"),
    "outage.": ("outage_answers", "path"),
    "conn.refused.": ("connections_refused", "limit"),
    "conn.closed.": ("connections_closed", "reason"),
    "rollout.beside_read.": ("rollout_write_beside_read", "result"),
}
_RENAME = {
    "req.total": "requests",
    "table.handed": "hit_table_handed",
    "table.touches": "hit_table_touches",
}
_HELP = {
    "dynamodb_calls": "DynamoDB calls (each attempt, retries included) by operation.",
    "dynamodb_throttles": "DynamoDB calls refused by throttling (retried within the deadline).",
    "dynamodb_errors": "DynamoDB calls that failed with a server or network error.",
    "dynamodb_timeouts_cut_short": (
        "DynamoDB attempts a caller's deadline cut under 0.1 s (not counted by the breaker)."
    ),
    "cache_lookups": "Lease cache lookups by result.",
    "lease_requests": "get_lease outcomes.",
    "lease_extensions": "Background lease extensions (refresh-ahead) by result.",
    "lease_confirmations": "Background re-confirmations of cached leases (every S/2) by result.",
    "prefetch_takes": "Takes from the prefetched candidate buffer by result.",
    "shed_requests": "Requests refused at once instead of queued, by reason.",
    "connections_refused": "Connections closed as they were made: their caller held its limit.",
    "connections_closed": "Connections the daemon closed: idle, a frame half-sent, buffer bound.",
    "request_errors": "Requests answered with an error, by wire code.",
    "outage_answers": (
        "get_lease answered from a pool's outage window (DynamoDB unreachable, past S): "
        "at_once, or after_failure of the request's own calls."
    ),
    "rollout_write_beside_read": (
        "Rollout mode's mapping write beside a miss's first read: applied (a new or ended "
        "lease: three round trips), rejected (the key has a lease: a write unit), unknown, "
        "or not sent (no_candidate at hand, or a key this host knew lately: known)."
    ),
    "requests": "Requests received.",
    "hit_table_handed": "Hit tables handed to client processes (at their first answer).",
    "hit_table_touches": (
        "Notices that an answer past S/2 was read from a hit table (the daemon re-confirms "
        "or extends it as after a hit)."
    ),
}
_BAD = re.compile(r"[^a-zA-Z0-9_]")


def counter_family(name: str) -> tuple[str, str | None, str | None]:
    """(family without ``rasd_`` and ``_total``, label name, label value) for a counter name."""
    if name in _EXACT:
        return _EXACT[name]
    for prefix, (family, label) in _PREFIX.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return family, label, name[len(prefix) :]
    if name.startswith("ddb.") and name[4:5].isupper():
        return "dynamodb_calls", "op", name[4:]
    if name in _RENAME:
        return _RENAME[name], None, None
    if name.startswith("ddb."):
        name = "dynamodb." + name[4:]
    flat = _BAD.sub("_", name).lower().strip("_")
    if flat.endswith("_total"):
        flat = flat[: -len("_total")]
    return flat, None, None


# ------------------------------------------------------------------------------ collector
class _Snapshot(Protocol):
    def snapshot(self) -> Mapping[str, Any]: ...


#: A gauge callback: one value, or one value per pool (``{"client/pool": 3}``).
GaugeFn = Callable[[], "float | Mapping[str, float]"]


@dataclass(frozen=True)
class Gauge:
    """A gauge read at scrape time, e.g. ``Gauge("Cached leases.", lambda: len(cache))``."""

    help: str
    fn: GaugeFn
    label: str = "pool"


class RasdCollector:
    """A prometheus_client collector over a ``Counters``-like object, latency histograms and
    gauge callbacks. Register it on a registry (see :func:`build_registry`)."""

    def __init__(
        self,
        counters: _Snapshot,
        latency: LatencyHistograms | None = None,
        gauges: Mapping[str, Gauge] | None = None,
        *,
        version: str | None = None,
        pools: PoolMetrics | None = None,
        claimable: Callable[[], Mapping[PoolKey, float]] | None = None,
    ) -> None:
        self.counters = counters
        self.latency = latency
        self.gauges = dict(gauges or {})
        self.version = version
        self.pools = pools
        self.claimable = claimable
        self.scrape_errors = 0

    def collect(self) -> Iterator[Metric]:
        pc = require()
        core = pc.metrics_core
        yield from self._counters(core)
        if self.latency is not None:
            yield from self._latency(core)
        for name, g in self.gauges.items():
            try:
                value = g.fn()
            except Exception:  # noqa: BLE001 - a broken gauge must not break the scrape
                self.scrape_errors += 1
                continue
            if isinstance(value, Mapping):
                fam = core.GaugeMetricFamily(f"rasd_{name}", g.help, labels=[g.label])
                for key, v in sorted(value.items()):
                    fam.add_metric([str(key)], float(v))
            else:
                fam = core.GaugeMetricFamily(f"rasd_{name}", g.help, value=float(value))
            yield fam
        if self.pools is not None:
            try:
                yield from list(self.pools.families(core, self.claimable))
            except Exception:  # noqa: BLE001 - a broken gauge must not break the scrape
                self.scrape_errors += 1
        if self.version is not None:
            info = core.GaugeMetricFamily("rasd_build_info", "rasd version.", labels=["version"])
            info.add_metric([self.version], 1.0)
            yield info
        yield core.CounterMetricFamily(
            "rasd_scrape_errors", "Gauge callbacks that raised.", value=self.scrape_errors
        )

    def _counters(self, core: Any) -> Iterator[Metric]:
        families: dict[str, Any] = {}
        for name, value in sorted(dict(self.counters.snapshot()).items()):
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            family, label, label_value = counter_family(name)
            fam = families.get(family)
            if fam is None:
                doc = _HELP.get(family, f"rasd counter {name}.")
                fam = families[family] = core.CounterMetricFamily(
                    f"rasd_{family}", doc, labels=[label] if label else None
                )
            fam.add_metric([label_value] if label else [], value)
        yield from families.values()

    def _latency(self, core: Any) -> Iterator[Metric]:
        assert self.latency is not None
        bounds = self.latency.bounds
        fam = core.HistogramMetricFamily(
            "rasd_request_duration_seconds",
            "get_lease latency in the daemon, by path (hit, existing, new).",
            labels=["path"],
        )
        for path, (counts, total) in sorted(self.latency.read().items()):
            cumulative, buckets = 0, []
            for i, c in enumerate(counts):
                cumulative += c
                le = _fmt(bounds[i]) if i < len(bounds) else "+Inf"
                buckets.append((le, float(cumulative)))
            fam.add_metric([path], buckets, total)
        yield fam


def _fmt(x: float) -> str:
    return repr(float(x))


def build_registry(
    counters: _Snapshot,
    latency: LatencyHistograms | None = None,
    gauges: Mapping[str, Gauge] | None = None,
    *,
    version: str | None = None,
    process: bool = True,
    pools: PoolMetrics | None = None,
    claimable: Callable[[], Mapping[PoolKey, float]] | None = None,
) -> CollectorRegistry:
    """A private registry with rasd's collector (and the process collector: RSS, CPU, open
    fds, which is connections). ``pools``: the per-pool capacity families (rasd.observe.pools),
    with ``claimable`` read at scrape time. Raises MetricsUnavailable without
    prometheus_client."""
    pc = require()
    registry: CollectorRegistry = pc.CollectorRegistry(auto_describe=False)
    registry.register(
        RasdCollector(counters, latency, gauges, version=version, pools=pools, claimable=claimable)
    )
    if process:
        pc.ProcessCollector(registry=registry)
    return registry


#: connections the metrics port serves at once (a thread each); more are closed as they come,
#: so that idle connections cannot take the service's TasksMax= (256) from the daemon
METRICS_CONNECTIONS = 8
#: seconds a metrics connection may take to send its request or read the answer
METRICS_TIMEOUT = 5.0


@dataclass
class MetricsServer:
    """A running exporter: ``port`` (the real one when 0 was asked), ``refused()`` (the
    connections closed unserved, every handler busy) and ``close()``."""

    addr: str
    port: int
    _server: Any
    _thread: Any

    def refused(self) -> int:
        return int(self._server.refused)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_http(port: int, addr: str = "127.0.0.1", *, registry: CollectorRegistry) -> MetricsServer:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread, each
    connection in a thread of its own: at most :data:`METRICS_CONNECTIONS` at once, each for
    at most :data:`METRICS_TIMEOUT` s of silence.

    Loopback by default: the scraper is a local agent; expose it wider only on purpose.
    """
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    pc = require()
    from prometheus_client.exposition import ThreadingWSGIServer

    class Handler(WSGIRequestHandler):
        timeout = METRICS_TIMEOUT  # StreamRequestHandler: the socket's timeout

        def log_message(self, format: str, *args: Any) -> None:  # silent, as the base's
            pass

    class Server(ThreadingWSGIServer):
        request_queue_size = 128  # the listen backlog (socketserver's 5 drops a burst's SYNs)
        slots = threading.BoundedSemaphore(METRICS_CONNECTIONS)
        refused = 0

        def process_request(self, request: Any, client_address: Any) -> None:
            if not self.slots.acquire(blocking=False):
                Server.refused += 1
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except BaseException:  # no thread started (one that did releases its own slot)
                self.slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

    server = make_server(addr, port, pc.make_wsgi_app(registry), Server, handler_class=Handler)
    thread = threading.Thread(target=server.serve_forever, name="rasd-metrics", daemon=True)
    thread.start()
    return MetricsServer(addr, int(server.server_port), server, thread)
