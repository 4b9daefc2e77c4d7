"""The alert rules fire on a pool emptied under `rasd dev`'s settings.

A daemon on moto (rasd dev's settings) serves a pool of 5 resources with metrics on; keys are
leased until the pool answers NO_CAPACITY; its /metrics is scraped before and after; then
ras-balancer runs with ``--metrics-file`` (what a textfile collector would serve), and the
daemon stops, so that a third scrape fails. promtool's unit-test file is built from those
scrapes (each sample a series with ``job="rasd"``; the second scrape's values held while
nothing changes; ``up`` 1 while the scrapes answered, 0 after) and from the balancer's file,
and ``promtool test rules`` checks that RasdPoolNoCapacity, RasdPoolRegionShort,
RasdPoolRunningOut and RasdTargetDown fire on them.

``RASD_ALERT_DEMO_DIR=dir pytest -s tests/integration/test_alerts_fire.py`` keeps the scrapes,
the balancer's file and the promtool test there, and prints promtool's output.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import structlog
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rasd.devtools.dev import DEV_SETTINGS
from rasd_client import NoCapacity
from rasd_client import aio as rasd_aio
from rasd_jobs import balancer
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops" / "prometheus" / "rasd-alerts.yml"
PROMTOOL = shutil.which("promtool")
POOL_SIZE = 5
NO_CAPACITY_ANSWERS = 7
HELD = 5  # minutes the second scrape's values are held (the daemon ran on unchanged)
AFTER = 10  # minutes of series after the daemon stopped

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str, **extra: str) -> Series:
    out: Series = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {**s.labels, **extra}
            out[(s.name, tuple(sorted(labels.items())))] = float(s.value)
    return out


def series_name(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{body}}}"


def fmt(v: float) -> str:
    return str(int(v)) if v == int(v) else repr(v)


def humanize(v: float) -> str:
    """Prometheus's ``humanize`` for the small whole numbers used here."""
    assert v == int(v) and abs(v) < 1000, v
    return str(int(v))


def render(template: str, labels: dict[str, str], value: float) -> str:
    """The two template forms the rules tested here use."""
    text = template.replace("{{ $value | humanize }}", humanize(value))
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)


def expected(alert: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    rules = yaml.safe_load(RULES.read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    return {
        "exp_labels": {**rule["labels"], **labels},
        "exp_annotations": {k: render(v, labels, value) for k, v in rule["annotations"].items()},
    }


def scrape(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


@pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package `prometheus`: `make tools` installs it)",
)
async def test_alerts_fire_on_a_pool_emptied_under_rasd_dev(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    make_daemon: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("prometheus_client")
    keep = os.environ.get("RASD_ALERT_DEMO_DIR")
    out_dir = Path(keep or tempfile.mkdtemp(prefix="rasd-alerts-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_pool(ddb, table, count=POOL_SIZE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hour = timedelta(hours=1)
    answers: list[str] = []
    async with make_daemon(metrics_port=port, **DEV_SETTINGS) as d:
        sock = d.cfg.socket

        async def lease(key: str) -> None:
            try:
                await rasd_aio.get_lease("demo", "default", key, hour, socket_path=sock, timeout=10)
                answers.append("lease")
            except NoCapacity:
                answers.append("NO_CAPACITY")

        await lease("k0")
        first = await asyncio.to_thread(scrape, port)
        for i in range(1, POOL_SIZE + NO_CAPACITY_ANSWERS):
            await lease(f"k{i}")
        second = await asyncio.to_thread(scrape, port)
        await rasd_aio.close()
    assert answers == ["lease"] * POOL_SIZE + ["NO_CAPACITY"] * NO_CAPACITY_ANSWERS
    with pytest.raises(OSError):
        scrape(port)  # the third scrape: the daemon is gone

    # the balancer's view of the table, as a textfile collector would serve it
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = f"rasd-alerts-{table.lower()}"
    s3.create_bucket(Bucket=bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    job_file = out_dir / "ras-balancer.prom"
    argv = [
        "--table", table, "--region", "us-east-1", "--regions", "us-east-1",
        "--endpoint-url", moto_endpoint, "--state-uri", f"s3://{bucket}/b", "--unreplicated",
        "--metrics-file", str(job_file), "--log-level", "warning",
    ]  # fmt: skip
    saved = structlog.get_config()
    try:
        assert await asyncio.to_thread(balancer.main, argv) == 0
    finally:
        structlog.configure(**saved)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["acquisitions"] == POOL_SIZE

    (out_dir / "scrape-1.txt").write_text(first)
    (out_dir / "scrape-2.txt").write_text(second)
    daemon = {"job": "rasd", "instance": "rasd-dev"}
    s1, s2 = parse(first, **daemon), parse(second, **daemon)
    jobs = parse(job_file.read_text(), job="node", instance="jenkins-agent")
    input_series = [
        {
            "series": series_name(*k),
            "values": f"{fmt(s1[k]) if k in s1 else '_'} {fmt(v)}x{HELD}",
        }
        for k, v in sorted(s2.items())
    ]
    input_series.append(
        {
            "series": 'up{instance="rasd-dev",job="rasd"}',
            "values": f"1 1x{HELD} 0x{AFTER}",
        }
    )
    input_series += [
        {"series": series_name(*k), "values": f"{fmt(v)}x{HELD + AFTER + 1}"}
        for k, v in sorted(jobs.items())
    ]

    nocap = s2[("rasd_pool_no_capacity_total", (
        ("client_id", "demo"), ("instance", "rasd-dev"), ("job", "rasd"), ("pool_id", "default"),
    ))]  # fmt: skip
    assert nocap == NO_CAPACITY_ANSWERS
    pool = {"client_id": "demo", "pool_id": "default"}
    region_labels = {
        **pool, "region": "us-east-1", "ras_job": "balancer", "ras_region": "us-east-1",
        "table": table, "job": "node", "instance": "jenkins-agent",
    }  # fmt: skip
    headroom = jobs[("ras_pool_headroom", tuple(sorted(region_labels.items())))]
    assert headroom < 0, headroom
    late = f"{HELD + 6}m"  # past every rule's `for`
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series,
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "RasdPoolNoCapacity",
                        "exp_alerts": [expected("RasdPoolNoCapacity", pool, nocap)],
                    },
                    {
                        "eval_time": "2m",
                        "alertname": "RasdDown",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": late,
                        "alertname": "RasdTargetDown",
                        "exp_alerts": [
                            expected("RasdTargetDown", daemon, 0),
                        ],
                    },
                    {
                        "eval_time": late,
                        "alertname": "RasdPoolRegionShort",
                        "exp_alerts": [expected("RasdPoolRegionShort", region_labels, headroom)],
                    },
                    {
                        "eval_time": late,
                        "alertname": "RasdPoolRunningOut",
                        "exp_alerts": [
                            expected("RasdPoolRunningOut", {**pool, "table": table}, headroom)
                        ],
                    },
                    {"eval_time": late, "alertname": "RasdJobFailed", "exp_alerts": []},
                ],
            }
        ],
    }
    test_file = out_dir / "alerts-on-an-emptied-pool.test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False, width=120))
    result = await asyncio.to_thread(
        lambda: subprocess.run(
            [str(PROMTOOL), "test", "rules", str(test_file)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    )
    # The same series with no alert expected: promtool's failure lists what fires ("got").
    for case in tests["tests"][0]["alert_rule_test"]:
        case["exp_alerts"] = []
    shown = out_dir / "alerts-on-an-emptied-pool.expect-none.test.yml"
    shown.write_text(yaml.safe_dump(tests, sort_keys=False, width=120))
    listed = await asyncio.to_thread(
        lambda: subprocess.run(
            [str(PROMTOOL), "test", "rules", str(shown)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    )
    if keep:  # the demo's output, for whoever asked for its files
        with capsys.disabled():
            print(f"\n$ promtool test rules {test_file}\n{result.stdout}{result.stderr}")
            print(f"$ promtool test rules {shown}\n{listed.stdout}{listed.stderr}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert listed.returncode != 0
    for alert in ("RasdPoolNoCapacity", "RasdTargetDown", "RasdPoolRegionShort"):
        assert f'alertname="{alert}"' in listed.stdout + listed.stderr
    if not keep:
        shutil.rmtree(out_dir, ignore_errors=True)
