"""What a job publishes for Prometheus (rasd_jobs.metrics): the exposition, the textfile and
its carried-over last success, without any network."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rasd_jobs import metrics as jobmetrics

LIBERATOR_SUMMARY = {
    "job": "liberator",
    "table": "rasd",
    "region": "us-east-1",
    "dry_run": False,
    "cutoff": "2027-01-15T07:59:00.000000Z",
    "scanned": 15230,
    "freed": 810,
    "orphans_freed": 2,
    "errors": 3,
    "seconds": 4.2,
}


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        assert fam.type == "gauge", fam.name
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def args(tmp_path: Path, **kw: object) -> argparse.Namespace:
    base = {"table": "rasd", "region": "us-east-1", "pushgateway": None, "metrics_file": None}
    return argparse.Namespace(**{**base, **kw})


ID = (("ras_job", "liberator"), ("ras_region", "us-east-1"), ("table", "rasd"))


def test_summary_numbers_become_gauges_with_the_runs_identity() -> None:
    samples = jobmetrics.job_samples(LIBERATOR_SUMMARY, 1, 1_800_000_000.0)
    got = parse(
        jobmetrics.exposition(samples, jobmetrics.identity("liberator", "rasd", "us-east-1"))
    )
    assert got == {
        ("ras_job_last_run_timestamp_seconds", ID): 1_800_000_000.0,
        ("ras_job_failed", ID): 1.0,
        ("ras_job_errors", ID): 3.0,
        ("ras_job_scanned", ID): 15230.0,
        ("ras_job_freed", ID): 810.0,
        ("ras_job_orphans_freed", ID): 2.0,
        ("ras_job_duration_seconds", ID): 4.2,
    }  # no last success (exit 1); strings and booleans skipped


def test_a_success_without_errors_field_reports_zero_errors() -> None:
    got = parse(jobmetrics.exposition(jobmetrics.job_samples({"moved": 4, "seconds": 1.0}, 0, 5.0)))
    assert got[("ras_job_errors", ())] == 0
    assert got[("ras_job_failed", ())] == 0
    assert got[("ras_job_last_success_timestamp_seconds", ())] == 5.0
    assert got[("ras_job_moved", ())] == 4


def test_a_run_without_summary_is_a_failure() -> None:
    got = parse(jobmetrics.exposition(jobmetrics.job_samples(None, 2, 5.0)))
    assert got == {
        ("ras_job_last_run_timestamp_seconds", ()): 5.0,
        ("ras_job_failed", ()): 1.0,
    }


def test_pool_samples_headroom_is_free_less_the_projected_demand() -> None:
    cap = {
        ("acme", "ads", "us-east-1"): jobmetrics.PoolCapacity(10, 12.2, 21),
        ("acme", "ads", "eu-west-1"): jobmetrics.PoolCapacity(0, 0.0, 2),
    }
    got = parse(
        jobmetrics.exposition(jobmetrics.pool_samples(cap, 600.0), (("ras_job", "balancer"),))
    )
    east = (("client_id", "acme"), ("pool_id", "ads"), ("ras_job", "balancer"))
    east += (("region", "us-east-1"),)
    assert got[("ras_pool_free", east)] == 10
    assert got[("ras_pool_projected_demand", east)] == 12.2
    assert got[("ras_pool_headroom", east)] == -3  # 10 - ceil(12.2)
    assert got[("ras_pool_target_free", east)] == 21
    assert got[("ras_pool_horizon_seconds", (("ras_job", "balancer"),))] == 600
    west = (("client_id", "acme"), ("pool_id", "ads"), ("ras_job", "balancer"))
    assert got[("ras_pool_headroom", (*west, ("region", "eu-west-1")))] == 0


def test_label_values_are_escaped() -> None:
    text = jobmetrics.exposition([jobmetrics.Sample("ras_x", 1, (("k", 'a"b\\c\nd'),))])
    assert parse(text)[("ras_x", (("k", 'a"b\\c\nd'),))] == 1


def test_push_url_names_the_group_by_job_and_instance() -> None:
    url = jobmetrics.push_url("http://pg:9091/", "liberator", "rasd", "us-east-1")
    assert url == "http://pg:9091/metrics/job/ras-liberator/instance/rasd%3Aus-east-1"
    assert jobmetrics.push_url("http://pg", "liberator", "t", None).endswith("/instance/t%3Aall")


def test_textfile_is_written_whole_and_keeps_the_last_success(tmp_path: Path) -> None:
    path = tmp_path / "ras-liberator.prom"
    a = args(tmp_path, metrics_file=str(path))
    jobmetrics.publish(a, "ras-liberator", {"freed": 1, "errors": 0, "seconds": 1.0}, 0, now=100.0)
    first = parse(path.read_text())
    assert first[("ras_job_last_success_timestamp_seconds", ID)] == 100.0
    # a failed run an hour later: its own run time, the earlier success kept
    jobmetrics.publish(a, "ras-liberator", {"freed": 0, "errors": 2, "seconds": 1.0}, 1, now=3700.0)
    second = parse(path.read_text())
    assert second[("ras_job_last_run_timestamp_seconds", ID)] == 3700.0
    assert second[("ras_job_last_success_timestamp_seconds", ID)] == 100.0
    assert second[("ras_job_errors", ID)] == 2 and second[("ras_job_failed", ID)] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ras-liberator.prom"]  # no temporary left


def test_nothing_is_published_without_a_destination_or_for_a_locked_run(tmp_path: Path) -> None:
    jobmetrics.publish(args(tmp_path), "ras-liberator", {"freed": 1}, 0)
    path = tmp_path / "b.prom"
    jobmetrics.publish(
        args(tmp_path, metrics_file=str(path)), "ras-balancer", {"status": "locked"}, 0
    )
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_written_is_logged_not_raised(tmp_path: Path) -> None:
    a = args(tmp_path, metrics_file=str(tmp_path / "missing-dir" / "x.prom"))
    jobmetrics.publish(a, "ras-dedupe", {"released": 1}, 0)  # no exception


@pytest.mark.parametrize("prog", ["ras-liberator", "ras-dedupe", "ras-balancer"])
def test_every_scheduled_job_has_the_flags(prog: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rasd_jobs import balancer, dedupe, liberator

    monkeypatch.setenv("RASD_PUSHGATEWAY", "http://pg:9091")
    parser = {"ras-liberator": liberator, "ras-dedupe": dedupe, "ras-balancer": balancer}[prog]
    ns = parser.build_parser().parse_args(["--metrics-file", "/x.prom"])
    assert ns.pushgateway == "http://pg:9091" and ns.metrics_file == "/x.prom"
