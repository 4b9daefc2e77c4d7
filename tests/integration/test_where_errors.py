"""Errors that say where: a table asked in the wrong region names the table, the region and the
endpoint (rasadmin, the jobs, the daemon), and a resource file that is not UTF-8 names the
file and the line (exit 2, no traceback).

moto keeps one set of tables per region, as DynamoDB does: the fixture's table is in
us-east-1, so a client of eu-west-1 is told it does not exist, the mistake an operator makes
by copying `rasadmin add-resources --region eu-west-1` against a table of one region.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog

import rasd_client
from rasd.config import Config
from rasd.server import Daemon
from rasd_jobs import admin, liberator
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

WEST = "eu-west-1"


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch: pytest.MonkeyPatch) -> Any:
    """No AWS_REGION: each client asks its own region's tables. The jobs configure structlog
    for a CLI process; the session's setup is put back after."""
    monkeypatch.delenv("AWS_REGION", raising=False)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def run(
    main: Callable[[Sequence[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_rasadmin_in_another_region_names_table_region_and_endpoint(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table exists (in us-east-1): the message says where it was asked, that this may be
    the wrong region or endpoint, and does not simply say to create it."""
    seed_pool(ddb, table, count=1)
    argv = ["add-resources", "--table", table, "--endpoint-url", moto_endpoint, "--region", WEST]
    code, _, err = run(
        admin.main, [*argv, "--client", "demo", "--pool", "default", "--count", "3"], capsys
    )
    assert code == 1, err
    assert f"has no table {table!r}" in err, err
    assert f"(region {WEST})" in err and moto_endpoint in err, err
    assert "wrong region or endpoint" in err and "AWS_REGION" in err, err
    assert "run `rasadmin create-table`?" not in err, err
    assert "Traceback" not in err


def test_a_jobs_failed_scan_names_table_region_and_endpoint(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """ras-liberator's Scan segments fail on the missing table: each logged failure says
    where, and the job exits 1 with the errors counted."""
    argv = ["--table", table, "--endpoint-url", moto_endpoint, "--region", WEST]
    code, out, err = run(liberator.main, argv, capsys)
    assert code == 1 and json.loads(out.splitlines()[-1])["errors"] >= 1, (out, err)
    failed = [json.loads(line) for line in err.splitlines() if "segment_failed" in line]
    assert failed, err
    for line in failed:
        assert f"has no table {table!r}" in line["error"], line
        assert f"(region {WEST})" in line["error"] and moto_endpoint in line["error"], line


async def test_the_daemon_names_the_table_it_cannot_find(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """Degraded on a table missing in its region: STATUS and UNAVAILABLE name the table, the
    region and the endpoint."""
    cfg = Config(
        table=table,
        region=WEST,
        endpoint_url=moto_endpoint,
        socket=str(short_tmp / "w.sock"),
        ddb_warm_connections=1,
        startup_retry_initial=0.05,
        startup_retry_max=0.2,
    ).validate()
    d = Daemon(cfg)
    task = asyncio.create_task(d.run())
    try:
        for _ in range(400):
            if d.status.degraded is not None:
                break
            await asyncio.sleep(0.025)
        assert d.status.degraded is not None
        assert f"has no table {table!r}" in d.status.degraded, d.status.degraded
        assert f"(region {WEST})" in d.status.degraded and moto_endpoint in d.status.degraded, (
            d.status.degraded
        )
        with pytest.raises(rasd_client.Unavailable, match=f"has no table '{table}'"):
            await asyncio.to_thread(
                rasd_client.get_lease,
                "demo",
                "default",
                "k",
                timedelta(hours=1),
                socket_path=cfg.socket,
            )
    finally:
        d.stop()
        await task


@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
def test_a_resource_file_that_is_not_utf8_is_bad_usage(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stdin: bool,
) -> None:
    """Exit 2 naming the file and the line of the bad bytes; nothing added, no traceback."""
    seed_pool(ddb, table, count=0)
    data = b"good-1\ngood-2\nbad-\xff\xfe\ngood-3\n"
    path = tmp_path / "names.txt"
    path.write_bytes(data)
    if stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    argv = ["add-resources", "--table", table, "--endpoint-url", moto_endpoint]
    argv += ["--region", "us-east-1", "--client", "demo", "--pool", "default"]
    argv += ["--file", "-" if stdin else str(path)]
    code, out, err = run(admin.main, argv, capsys)
    assert code == 2, (out, err)
    where = "stdin" if stdin else str(path)
    assert f"{where}:3: not UTF-8" in err, err
    assert "Traceback" not in err and out == "", (out, err)
    items = ddb.scan(TableName=table)["Items"]
    assert not [it for it in items if it["client_id"]["S"] == "demo"], items
