"""Pure logic of the offline jobs: no DynamoDB, no network."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import structlog

from rasd.core.decide import pick
from rasd.core.lease import US, ResourceItem, fmt_time
from rasd_jobs import admin, common, dedupe, liberator
from rasd_jobs.admin import listing, resources

NOW = 1_800_000_000 * US


@pytest.fixture(autouse=True)
def _restore_structlog() -> Any:
    """main() configures structlog for a CLI process; put the session's setup back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def item(
    resource: str,
    region: str = "us-east-1",
    key: str | None = "k",
    acquired: int | None = None,
    expires: int | None = None,
    pool: str = "p",
) -> ResourceItem:
    return ResourceItem(
        client_id="c",
        resource=resource,
        pool_id=pool,
        region=region,
        partition=f"c.{pool}.{region}.0",
        version=3,
        key=key,
        lease_expires_us=expires if key else None,
        lease_acquired_us=acquired,
        lease_available=None if key else fmt_time(NOW),
    )


def test_dedupe_survivor_is_earliest_claim_then_region_then_resource() -> None:
    """The survivor among a key's leases is pick()'s choice (the daemons' rule too)."""
    a = item("r-b", acquired=NOW - 5)
    b = item("r-a", region="eu-west-1", acquired=NOW - 5)
    c = item("r-0", acquired=NOW - 1)
    assert pick([a, b, c]) is b  # same claim time as a: region order decides
    assert pick([c, item("r-z", acquired=NOW - 9)]).resource == "r-z"  # type: ignore[union-attr]


def test_dedupe_duplicates_only_groups_of_two_or_more() -> None:
    """A key held once, or the same key in two pools, is not a duplicate."""
    groups = {
        ("c", "p", "k1"): [item("a"), item("b")],
        ("c", "p", "k2"): [item("x")],
        ("c", "q", "k2"): [item("y", pool="q")],
    }
    assert [k for k, _ in dedupe.duplicates(groups)] == [("c", "p", "k1")]


def test_liberator_scan_filters_by_cutoff_and_region_with_attribute_names() -> None:
    """The Scan asks DynamoDB for lease_expires < now - grace of our region only, and names
    the reserved word ``region`` through ExpressionAttributeNames."""
    opts = liberator.Options(table="t", region="us-east-1", now_us=NOW, grace_us=60 * US)
    kw = liberator.scan_kwargs(opts)
    assert kw["IndexName"] == "leased_resources"
    assert kw["ExpressionAttributeValues"][":cutoff"] == {"S": fmt_time(NOW - 60 * US)}
    assert "#r = :region" in kw["FilterExpression"]
    assert kw["ExpressionAttributeNames"] == {"#r": "region"}
    assert "Limit" not in kw
    every = liberator.scan_kwargs(liberator.Options(table="t", region=None, now_us=NOW))
    assert "region" not in every["FilterExpression"] and "ExpressionAttributeNames" not in every


def test_liberator_run_frees_nothing_in_dry_run_and_checks_expiry_itself() -> None:
    """Even if a page returned a running lease or another region's item (a filter bug), the
    liberator re-checks and leaves it; in dry-run it never writes."""

    class Fake:
        def __init__(self, items: list[dict[str, Any]]) -> None:
            self.items = items
            self.writes: list[dict[str, Any]] = []

        def get_paginator(self, op: str) -> Any:
            assert op == "scan"
            return self

        def paginate(self, **kw: Any) -> Any:
            return iter([{"Items": self.items, "ScannedCount": len(self.items)}])

        def get_item(self, **kw: Any) -> dict[str, Any]:
            return {}  # no rollout record

        def update_item(self, **kw: Any) -> dict[str, Any]:
            self.writes.append(kw)
            return {}

    def raw(resource: str, expires_us: int, region: str = "us-east-1") -> dict[str, Any]:
        return {
            "client_id": {"S": "c"},
            "resource": {"S": resource},
            "pool_id": {"S": "p"},
            "region": {"S": region},
            "key": {"S": "k"},
            "lease_expires": {"S": fmt_time(expires_us)},
            "holder": {"S": "t1"},  # rasd's leases (the paper's would turn rollout mode on)
            "hver": {"N": "1"},
            "version": {"N": "1"},
        }

    pages = [raw("old", NOW - 3600 * US), raw("live", NOW + 1), raw("west", 0, "eu-west-1")]
    fake = Fake(pages)
    opts = liberator.Options(table="t", region="us-east-1", now_us=NOW, segments=1)
    s = liberator.run(fake, opts)
    assert (s["scanned"], s["expired"], s["freed"]) == (3, 1, 1)
    assert [w["Key"]["resource"]["S"] for w in fake.writes] == ["old"]
    fake = Fake(pages)
    s = liberator.run(fake, liberator.Options(**{**opts.__dict__, "dry_run": True}))
    assert (s["expired"], s["freed"], s["would_free"]) == (1, 0, 1) and fake.writes == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1800000000", NOW),
        ("1800000000.5", NOW + US // 2),
        (fmt_time(NOW), NOW),
        ("2027-01-15T08:00:00Z", 1_800_000_000 * US),
    ],
)
def test_parse_now_accepts_epoch_seconds_and_utc_times(raw: str, expected: int) -> None:
    """--now takes epoch seconds or the table's fixed-width UTC time (fraction optional)."""
    assert common.parse_now(raw) == expected


def test_parse_now_rejects_garbage_as_usage_error() -> None:
    with pytest.raises(common.UsageError, match="--now"):
        common.parse_now("yesterday")


@pytest.mark.parametrize("bad", ["", "a.b", "#meta", "x" * 65, "sp ace", "ünï"])
def test_check_name_rejects_what_the_daemon_rejects(bad: str) -> None:
    """Names the jobs accept are exactly rasd.core.lease.valid_name's: no '.', no '#'."""
    with pytest.raises(common.UsageError, match="bad pool"):
        common.check_name("pool", bad)


def test_ras_region_from_flag_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags override RASD_REGION; a missing region is a usage error only where required."""
    monkeypatch.setenv("RASD_REGION", "eu-west-1")
    assert common.ras_region(argparse.Namespace(region=None)) == "eu-west-1"
    assert common.ras_region(argparse.Namespace(region="us-east-1")) == "us-east-1"
    monkeypatch.delenv("RASD_REGION")
    assert common.ras_region(argparse.Namespace(region=None), required=False) is None
    with pytest.raises(common.UsageError, match="RASD_REGION"):
        common.ras_region(argparse.Namespace(region=None))


def test_parse_peer() -> None:
    assert common.parse_peer("eu-west-1=https://ddb.example:443") == (
        "eu-west-1",
        "https://ddb.example:443",
    )
    for bad in ["eu-west-1", "eu-west-1=", "EU=http://x", "eu-west-1=ftp://x"]:
        with pytest.raises(common.UsageError):
            common.parse_peer(bad)


def test_admin_state_of() -> None:
    """free / leased / expired (leased, past lease_expires, not yet liberated)."""
    assert listing.state_of(item("a", key=None), NOW) == "free"
    assert listing.state_of(item("a", expires=NOW + 1), NOW) == "leased"
    assert listing.state_of(item("a", expires=NOW), NOW) == "expired"


def test_admin_resource_names_never_reuse_an_existing_name() -> None:
    """--count skips names that exist (they might be leased); --file skips them and its own
    repeats, and ignores blank lines."""
    args = argparse.Namespace(count=3, prefix="r-", pool="p", file=None)
    names, skipped = resources.resource_names(args, {"r-000000", "r-000002"})
    assert names == ["r-000001", "r-000003", "r-000004"] and skipped == 0
    args = argparse.Namespace(count=None, prefix=None, pool="p", file="-")
    stdin = io.StringIO("a\n\n b \na\nexists\n")
    mp = pytest.MonkeyPatch()
    mp.setattr("sys.stdin", stdin)
    try:
        names, skipped = resources.resource_names(args, {"exists"})
    finally:
        mp.undo()
    assert names == ["a", "b"] and skipped == 2


def test_render_table() -> None:
    out = listing.render_table([{"a": 1, "bb": None}, {"a": 22, "bb": "x"}], ["a", "bb"])
    assert out.splitlines() == ["A   BB", "1   -", "22  x"]


def test_progress_draws_only_on_a_terminal() -> None:
    """Progress goes to stderr only when it is a TTY: logs piped to Jenkins stay clean."""
    s = io.StringIO()
    p = common.Progress("x", 10, stream=s)
    p.add(10)
    p.close()
    assert s.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    t = Tty()
    p = common.Progress("x", 2, stream=t)
    p.add(2)
    p.close()
    assert "2/2" in t.getvalue() and t.getvalue().endswith("\n")


def test_liberator_without_region_exits_2_before_any_io(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --region and no RASD_REGION: a clear message and exit 2, no client made."""
    monkeypatch.delenv("RASD_REGION", raising=False)

    def no_client(*a: Any, **k: Any) -> Any:
        raise AssertionError("no DynamoDB client may be made")

    monkeypatch.setattr(common, "make_client", no_client)
    assert liberator.main(["--table", "t"]) == 2
    assert dedupe.main(["--table", "t"]) == 2
    err = capsys.readouterr().err
    assert err.count("no region: pass --region or set RASD_REGION") == 2


def test_help_mentions_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    """Every --help explains the flags and the environment variables."""
    for main, argv in [
        (liberator.main, ["--help"]),
        (dedupe.main, ["--help"]),
        (admin.main, ["--help"]),
        (admin.main, ["add-resources", "--help"]),
        (admin.main, ["stats", "--help"]),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
        out = capsys.readouterr().out
        for var in ("RASD_TABLE", "RASD_REGION", "AWS_REGION", "AWS_ENDPOINT_URL_DYNAMODB"):
            assert var in out, (argv, var)


JENKINSFILE = Path(__file__).parents[2] / "jobs" / "Jenkinsfile"
#: what a build's parameters were tried with: each would run a command in a shell that
#: interpolated it
INJECTIONS = (
    "us-east-1;touch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "us-east-1\ntouch pwned",
    "us-east-1 && touch pwned",
    "us-east-1|touch pwned",
    "rasd' ; touch pwned ; '",
)


def _shell_scripts() -> list[str]:
    """The pipeline's shell scripts, as Groovy hands them to ``sh`` (a backslash before a
    newline joins the lines)."""
    text = JENKINSFILE.read_text()
    return [s.replace("\\\n", "") for s in re.findall(r"sh '''\n(.*?)'''", text, re.S)]


def _run_script(script: str, tmp_path: Path, **env: str) -> list[str]:
    """Run one of the pipeline's scripts with the jobs replaced by a stub that prints its
    arguments and region, one per line (what the summary file then holds)."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for job in ("ras-balancer", "ras-liberator", "ras-dedupe"):
        stub = bin_dir / job
        stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\necho "$RASD_REGION"\n')
        stub.chmod(0o755)
    base = {"PATH": "/usr/bin:/bin", "RAS_DRY_RUN": ""}
    subprocess.run(["sh", "-c", script], cwd=tmp_path, env={**base, **env}, check=True)
    (summary,) = tmp_path.glob("summary-*.json")
    lines = summary.read_text().splitlines()
    summary.unlink()
    return lines


def test_jenkinsfile_gives_the_balancer_every_regions_endpoint(tmp_path: Path) -> None:
    """ras-balancer moves a donor region's items in that region's replica: the shipped
    pipeline passes --peer-endpoint for every region but the primary (the balancer refuses
    to run without them), and the region list it derives them from."""
    (script,) = [s for s in _shell_scripts() if "ras-balancer" in s]
    args = _run_script(
        script,
        tmp_path,
        RAS_REGIONS="us-east-1,us-west-2,eu-west-1",
        RAS_PRIMARY_REGION="us-east-1",
    )
    assert args == [
        "--regions",
        "us-east-1,us-west-2,eu-west-1",
        "--peer-endpoint",
        "us-west-2=https://dynamodb.us-west-2.amazonaws.com",
        "--peer-endpoint",
        "eu-west-1=https://dynamodb.eu-west-1.amazonaws.com",
        "us-east-1",
    ]


def test_jenkinsfile_parameters_cannot_run_a_command(tmp_path: Path) -> None:
    """Whoever may start a build with parameters cannot run a command beside the jobs' AWS
    credentials: Groovy interpolates nothing into a shell script (all are single-quoted,
    parameters reach them through the environment); the first stage refuses a value of the
    wrong shape; and even a value that got past it stays a word to the shell."""
    text = JENKINSFILE.read_text()
    assert 'sh """' not in text and 'sh "' not in text
    scripts = _shell_scripts()
    assert len(scripts) == 3 and not any("${" in s for s in scripts)
    # the shapes the 'parameters' stage checks (Groovy's ==~ is a full match)
    stage = text[text.index("stage('parameters')") : text.index("stage('install')")]
    shapes = {
        name: re.compile(pattern.replace("\\/", "/"))
        for name, pattern in re.findall(r"^\s+([A-Z_]+): /(.*)/,$", stage, re.M)
    }
    assert set(shapes) == {"JOB", "REGIONS", "PRIMARY_REGION", "TABLE", "STATE_URI", "CONFIG"}
    defaults = {
        "JOB": "balancer",
        "REGIONS": "us-east-1,us-west-2,eu-west-1",
        "PRIMARY_REGION": "us-east-1",
        "TABLE": "rasd",
        "STATE_URI": "s3://rasd-ops/balancer",
        "CONFIG": "/etc/rasd/rasd.toml",
    }
    for name, shape in shapes.items():
        assert shape.fullmatch(defaults[name]), name
        for bad in INJECTIONS:
            assert not shape.fullmatch(bad), (name, bad)
    assert shapes["CONFIG"].fullmatch("")  # empty: the daemons' defaults
    # past the check, a parameter is still only data to the scripts
    for bad in INJECTIONS:
        for script in scripts[1:]:
            _run_script(
                script,
                tmp_path,
                RAS_REGIONS=bad,
                RAS_PRIMARY_REGION=bad,
                RASD_REGION=bad,
                RAS_JOB="dedupe",
            )
            assert not (tmp_path / "pwned").exists(), bad
