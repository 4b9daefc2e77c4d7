"""Prometheus exporter: names and labels of exported counters, histograms, gauges."""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rasd.observe import prom
from rasd.observe.metrics import Counters
from rasd.observe.prom import (
    METRICS_CONNECTIONS,
    Gauge,
    LatencyHistograms,
    MetricsUnavailable,
    build_registry,
    counter_family,
    require,
    start_http,
)
from tests.helpers.deadlines import SETTLE


def scrape(**kw: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    counters = kw.pop("counters", None) or Counters()
    reg = build_registry(counters, process=False, **kw)  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_dynamodb_calls_are_labelled_by_operation() -> None:
    """ddb.<Op> counters become one family with an op label; throttles/errors stay apart."""
    c = Counters()
    c.inc("ddb.Query", 5)
    c.inc("ddb.UpdateItem", 2)
    c.inc("ddb.throttles", 3)
    c.inc("ddb.errors")
    m = scrape(counters=c)
    assert m[("rasd_dynamodb_calls_total", (("op", "Query"),))] == 5
    assert m[("rasd_dynamodb_calls_total", (("op", "UpdateItem"),))] == 2
    assert m[("rasd_dynamodb_throttles_total", ())] == 3
    assert m[("rasd_dynamodb_errors_total", ())] == 1


def test_known_counters_map_to_labelled_families() -> None:
    """Cache, lease, shed and error counters are exported with natural labels."""
    c = Counters()
    for name in (
        "cache.hit",
        "cache.hit",
        "cache.miss",
        "lease.new",
        "lease.existing",
        "shed.busy",
        "shed.rate_limited",
        "err.NO_CAPACITY",
        "req.total",
        "prefetch.conflicts",
    ):
        c.inc(name)
    m = scrape(counters=c)
    assert m[("rasd_cache_lookups_total", (("result", "hit"),))] == 2
    assert m[("rasd_cache_lookups_total", (("result", "miss"),))] == 1
    assert m[("rasd_lease_requests_total", (("outcome", "new"),))] == 1
    assert m[("rasd_lease_requests_total", (("outcome", "existing"),))] == 1
    assert m[("rasd_shed_requests_total", (("reason", "busy"),))] == 1
    assert m[("rasd_shed_requests_total", (("reason", "rate_limited"),))] == 1
    assert m[("rasd_request_errors_total", (("code", "NO_CAPACITY"),))] == 1
    assert m[("rasd_requests_total", ())] == 1
    assert m[("rasd_prefetch_conflicts_total", ())] == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ddb.GetItem", ("dynamodb_calls", "op", "GetItem")),
        ("ddb.conditional_failed", ("dynamodb_conditional_failed", None, None)),
        ("singleflight.joined", ("singleflight_joined", None, None)),
        ("conn.opened", ("conn_opened", None, None)),
        ("weird-name.x y", ("weird_name_x_y", None, None)),
        ("foo.total", ("foo", None, None)),
        ("shed.", ("shed", None, None)),
    ],
)
def test_counter_family_naming(name: str, expected: tuple[str, str | None, str | None]) -> None:
    """Every counter name, known or new, maps to a valid Prometheus name: a counter added
    later is exported rather than dropped or crashing the scrape."""
    assert counter_family(name) == expected


def test_unknown_counters_still_exported_and_non_numbers_skipped() -> None:
    """New counters appear without touching prom.py; odd snapshot values are ignored."""

    class Snap:
        def snapshot(self) -> dict[str, object]:
            return {"new.thing": 7, "text": "x", "flag": True}

    m = scrape(counters=Snap())
    assert m[("rasd_new_thing_total", ())] == 7
    assert not any(k[0].startswith(("rasd_text", "rasd_flag")) for k in m)


def test_latency_histograms_export_cumulative_buckets_per_path() -> None:
    """observe() feeds rasd_request_duration_seconds{path} with le-semantics buckets:
    a value equal to a bound lands in that bound's bucket."""
    lat = LatencyHistograms(bounds=(0.001, 0.01, 0.1))
    lat.observe("hit", 0.0002)
    lat.observe("hit", 0.001)
    lat.observe("new", 0.05)
    lat.observe("new", 3.0)
    m = scrape(latency=lat)
    b = "rasd_request_duration_seconds_bucket"
    assert m[(b, (("le", "0.001"), ("path", "hit")))] == 2
    assert m[(b, (("le", "+Inf"), ("path", "hit")))] == 2
    assert m[(b, (("le", "0.01"), ("path", "new")))] == 0
    assert m[(b, (("le", "0.1"), ("path", "new")))] == 1
    assert m[(b, (("le", "+Inf"), ("path", "new")))] == 2
    assert m[("rasd_request_duration_seconds_count", (("path", "new"),))] == 2
    assert m[("rasd_request_duration_seconds_sum", (("path", "new"),))] == pytest.approx(3.05)
    # the default paths are present from the start, at zero
    assert m[("rasd_request_duration_seconds_count", (("path", "existing"),))] == 0


def test_latency_snapshot_quantiles_for_stats() -> None:
    """The stats op gets count/sum and bucket-bound quantiles without prometheus."""
    lat = LatencyHistograms(paths=("hit",), bounds=(0.001, 0.01, 0.1))
    for _ in range(98):
        lat.observe("hit", 0.0005)
    lat.observe("hit", 0.05)
    lat.observe("hit", 5.0)
    snap = lat.snapshot()["hit"]
    assert snap["count"] == 100
    assert snap["p50"] == 0.001
    assert snap["p99"] == 0.1
    assert LatencyHistograms(paths=("x",)).snapshot()["x"]["p99"] == 0.0


def test_latency_bounds_must_increase() -> None:
    """Unsorted or duplicate bounds would silently mis-bucket: refused."""
    with pytest.raises(ValueError):
        LatencyHistograms(bounds=(0.1, 0.01))
    with pytest.raises(ValueError):
        LatencyHistograms(bounds=())


def test_gauges_scalar_per_pool_and_broken() -> None:
    """Gauge callbacks are read at scrape time; a per-pool mapping gets a label; a raising
    callback is skipped and counted, and the rest of the scrape still works."""

    def broken() -> float:
        raise RuntimeError("dict changed size during iteration")

    gauges = {
        "cache_leases": Gauge("Leases in the cache.", lambda: 12),
        "prefetch_candidates": Gauge("Candidates buffered.", lambda: {"demo/a": 3, "x/b": 0}),
        "broken": Gauge("Broken.", broken),
    }
    m = scrape(gauges=gauges, version="0.1.0")
    assert m[("rasd_cache_leases", ())] == 12
    assert m[("rasd_prefetch_candidates", (("pool", "demo/a"),))] == 3
    assert m[("rasd_prefetch_candidates", (("pool", "x/b"),))] == 0
    assert ("rasd_broken", ()) not in m
    assert m[("rasd_scrape_errors_total", ())] == 1
    assert m[("rasd_build_info", (("version", "0.1.0"),))] == 1


def test_missing_prometheus_client_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """With metrics_port set but the extra not installed, the daemon stops with the fix in
    the message instead of an ImportError traceback."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MetricsUnavailable, match=r"rasd\[metrics\]"):
        require()
    with pytest.raises(MetricsUnavailable):
        build_registry(Counters())


def test_latency_histograms_work_without_prometheus_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hot-path recorder never imports prometheus_client."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    lat = LatencyHistograms()
    lat.observe("hit", 0.0001)
    assert lat.snapshot()["hit"]["count"] == 1


def test_start_http_serves_metrics_on_loopback() -> None:
    """The exporter answers /metrics over HTTP on the address asked (loopback, any port)."""
    c = Counters()
    c.inc("cache.hit", 4)
    srv = start_http(0, registry=build_registry(c))
    try:
        assert srv.addr == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert 'rasd_cache_lookups_total{result="hit"} 4.0' in body
        assert "process_open_fds" in body
    finally:
        srv.close()


def test_idle_connections_cannot_take_the_exporters_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 connections that never send a request: the exporter serves METRICS_CONNECTIONS of
    them at once (a thread each, here for as long as the test) and closes the others as they
    come, so the daemon's threads stay within the service's TasksMax=; once the idle ones
    go, a scrape is answered."""
    monkeypatch.setattr(prom, "METRICS_TIMEOUT", 60.0)  # no handler frees its slot meanwhile
    srv = start_http(0, registry=build_registry(Counters()))
    before = threading.active_count()
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
        end = time.monotonic() + SETTLE  # the server's thread accepts them in turn
        while srv.refused() < 300 - METRICS_CONNECTIONS and time.monotonic() < end:
            time.sleep(0.01)
        assert srv.refused() == 300 - METRICS_CONNECTIONS
        assert threading.active_count() <= before + METRICS_CONNECTIONS
    finally:
        for s in idle:
            s.close()
    url = f"http://127.0.0.1:{srv.port}/metrics"
    end = time.monotonic() + SETTLE  # each handler ends as its peer's end reaches it
    try:
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    assert b"rasd_" in r.read()
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < end, "no scrape answered after the idle ones went"
                time.sleep(0.01)
    finally:
        srv.close()
