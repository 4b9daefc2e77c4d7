"""The jobs publish their runs for Prometheus (docs/operations.md, "Job and capacity
metrics"): ``--pushgateway`` POSTs to a Pushgateway (here a tiny local HTTP server that
records the request), ``--metrics-file`` writes a textfile-collector file. ras-balancer adds
each pool's capacity per region, the numbers of its headroom items."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from rasd.core.lease import US
from rasd_jobs import balancer, liberator
from tests.helpers.balancer import T0, E, W, claim_n
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


class Recorder(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.requests.append(
            {"path": self.path, "type": self.headers["Content-Type"], "body": body}
        )
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def pushgateway() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("H", (Recorder,), {"requests": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_liberator_pushes_its_run_and_writes_the_file(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    pushgateway: tuple[str, list[dict[str, Any]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, seen = pushgateway
    path = tmp_path / "ras-liberator.prom"
    monkeypatch.setenv("AWS_REGION", E)
    seed_pool(ddb, table, count=3)
    argv = [
        "--table", table, "--region", E, "--endpoint-url", moto_endpoint,
        "--now", str(T0 // US), "--pushgateway", url, "--metrics-file", str(path),
    ]  # fmt: skip
    assert liberator.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(seen) == 1
    req = seen[0]
    assert req["path"] == f"/metrics/job/ras-liberator/instance/{table}%3A{E}"
    assert req["type"].startswith("text/plain; version=0.0.4")
    ident = (("ras_job", "liberator"), ("ras_region", E), ("table", table))
    pushed = samples(req["body"])
    assert pushed[("ras_job_errors", ident)] == summary["errors"] == 0
    assert pushed[("ras_job_failed", ident)] == 0
    assert pushed[("ras_job_freed", ident)] == summary["freed"]
    assert ("ras_job_last_success_timestamp_seconds", ident) in pushed
    assert samples(path.read_text()) == pushed  # the file holds the same samples

    # a failed run (no such table): failed, its run time, and no new success in the push
    argv[1] = "no-such-table"
    assert liberator.main(argv) == 1
    failed = samples(seen[1]["body"])
    ident2 = (("ras_job", "liberator"), ("ras_region", E), ("table", "no-such-table"))
    assert failed[("ras_job_failed", ident2)] == 1
    assert ("ras_job_last_success_timestamp_seconds", ident2) not in failed
    assert seen[1]["path"].endswith("/instance/no-such-table%3Aus-east-1")


def test_balancer_publishes_each_pools_capacity(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    pushgateway: tuple[str, list[dict[str, Any]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, seen = pushgateway
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = f"rasd-metrics-{table.lower()}"
    s3.create_bucket(Bucket=bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    seed_pool(ddb, table, region=W, count=30)
    claim_n(ddb, table, W, 4, T0)
    path = tmp_path / "ras-balancer.prom"
    argv = [
        "--table", table, "--region", E, "--regions", f"{W},{E}", "--endpoint-url",
        moto_endpoint, "--state-uri", f"s3://{bucket}/b", "--now", str(T0 // US),
        "--unreplicated", "--pushgateway", url, "--metrics-file", str(path),
    ]  # fmt: skip
    assert balancer.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    got = samples(path.read_text())
    assert samples(seen[0]["body"]) == got
    assert seen[0]["path"] == f"/metrics/job/ras-balancer/instance/{table}%3A{E}"
    base = (("client_id", "demo"), ("pool_id", "default"), ("ras_job", "balancer"))
    for region in (E, W):
        labels = (*base, ("ras_region", E), ("region", region), ("table", table))
        item = ddb.get_item(
            TableName=table,
            Key={"client_id": {"S": "#meta"}, "resource": {"S": f"headroom#demo#default#{region}"}},
        )["Item"]
        assert got[("ras_pool_free", labels)] == int(item["free"]["N"])
        assert got[("ras_pool_headroom", labels)] == int(item["headroom"]["N"])
        assert got[("ras_pool_projected_demand", labels)] >= 0
    ident = (("ras_job", "balancer"), ("ras_region", E), ("table", table))
    assert got[("ras_job_moved", ident)] == summary["moved"]
    assert got[("ras_pool_horizon_seconds", ident)] == 600
    assert got[("ras_job_errors", ident)] == 0
