"""The benchmark's building blocks, once each: structure, never timing (no thresholds).

The delay proxy forwards bytes and HTTP requests both ways; the baseline agent (the paper's
in-process boto3 module) acquires a new lease, finds it again, and counts its DynamoDB calls.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from bench.baseline import BaselineAgent
from fleet import proxytest
from fleet.proxy import Proxy
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_proxy_self_tests_run() -> None:
    tcp = proxytest.self_test(delay_s=0.001, handshake_rtts=2.0, n=5)
    assert tcp["proxied_p50_ms"] > 0 and "first_rtt_new_conn_p50_ms" in tcp
    http = proxytest.http_self_test(delay_s=0.001, handshake_rtts=2.0, n=5)
    assert http["proxied_p50_ms"] > 0 and "first_request_ms" in http


def test_a_connection_opened_ahead_has_paid_its_handshakes() -> None:
    """HTTP mode: the handshakes run from the accept. A connection's first request sent at
    once waits for them; one sent after they had time to finish does not. Wide margins: 80
    ms of modelled handshakes against the scheduling noise of a loaded machine."""
    http = proxytest.http_self_test(delay_s=0.002, handshake_rtts=20.0, n=3)
    assert http["first_request_ms"] >= 84.0  # a 4 ms round trip + 80 ms of handshakes
    assert http["opened_ahead_ms"] < http["first_request_ms"] - 60.0


def test_baseline_agent_acquires_then_finds(ddb: Any, table: str, moto_endpoint: str) -> None:
    seed_pool(ddb, table, client_id="bench", pool_id="p", count=5)
    host, port = moto_endpoint.removeprefix("http://").split(":")
    with Proxy((host, int(port)), delay_s=0.0005, handshake_rtts=2.0, http=True) as px:
        agent = BaselineAgent(table, "us-east-1", px.url)
        exp = int((time.time() + 600) * 1_000_000)
        first = agent.get_lease("bench", "p", "k1", exp)
        again = agent.get_lease("bench", "p", "k1", exp)
    assert first.new and not again.new
    assert first.resource == again.resource
    assert agent.calls["UpdateItem"] >= 1
    assert agent.calls["Query"] >= 3  # miss + available page + the second lookup
