"""The jobs write nothing on a clock that is not trusted (rasd_jobs.common.guard_writes), as the
daemons serve nothing on one: a liberator 5 s ahead of moto's Date header frees nothing and
exits 1 saying why; on a synchronised-looking clock it frees. rasadmin's listings run on any
clock, its writes do not. Against moto over HTTP; the clock is moved by patching the jobs'
``time.time_ns``, the kernel's account by patching its reader."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rasd.core.clock_trust import KernelBound
from rasd.core.lease import US
from rasd_jobs import common, liberator
from rasd_jobs.admin import cli as admin
from tests.helpers.tables import hold, scan_all, seed_pool

pytestmark = [pytest.mark.integration]


def _run(main: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def _version(ddb: Any, table: str, resource: str) -> int:
    return next(
        int(it["version"]["N"]) for it in scan_all(ddb, table) if it["resource"]["S"] == resource
    )


def test_a_job_on_a_clock_off_by_5s_does_nothing_and_says_why(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed_pool(ddb, table, count=4)
    now = time.time_ns() // 1000
    hold(ddb, table, "res-00000", "k1", now + 600 * US, now)
    hold(ddb, table, "res-00001", "k2", now + US // 5, now)  # the liberator's work, soon
    time.sleep(2.5)  # past its end and the liberator's grace (2 s)
    before = _version(ddb, table, "res-00000")
    freed = _version(ddb, table, "res-00001")
    argv = ["--table", table, "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    release = ["release-resource", *argv, "--client", "demo", "--resource", "res-00000"]
    real = time.time_ns
    monkeypatch.setattr(common.time, "time_ns", lambda: real() + 5 * US * 1000)
    code, err = _run(liberator.main, [*argv, "--grace", "2"], capsys)
    assert code == common.EXIT_ERRORS
    assert "clock is not trusted" in err and "ahead of DynamoDB" in err, err
    assert _version(ddb, table, "res-00001") == freed  # its first write was refused
    # listings run on any clock; a write does not, and writes nothing
    code, _ = _run(admin.main, ["list-pools", "--table", table, "--endpoint-url", moto_endpoint],
                   capsys)  # fmt: skip
    assert code == 0
    code, err = _run(admin.main, release, capsys)
    assert code == common.EXIT_ERRORS and "clock is not trusted" in err, err
    assert _version(ddb, table, "res-00000") == before

    monkeypatch.setattr(common.time, "time_ns", real)
    code, err = _run(liberator.main, [*argv, "--grace", "2"], capsys)
    assert code == 0, err
    assert _version(ddb, table, "res-00001") > freed
    code, err = _run(admin.main, release, capsys)
    assert code == 0, err
    assert _version(ddb, table, "res-00000") > before  # the same command on a good clock


def test_the_kernels_account_counts_where_the_setting_says(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed_pool(ddb, table, count=2)
    argv = [
        *("add-resources", "--table", table, "--endpoint-url", moto_endpoint),
        *("--region", "us-east-1", "--client", "demo", "--pool", "default", "--count", "1"),
    ]
    monkeypatch.setattr(common, "read_host_bound", lambda: KernelBound(False, 16 * US))
    monkeypatch.setenv("RASD_CLOCK_CHECK", "kernel")
    code, err = _run(admin.main, argv, capsys)
    assert code == common.EXIT_ERRORS and "not synchronised" in err, err
    monkeypatch.setattr(common, "read_host_bound", lambda: KernelBound(True, 20_000))
    code, err = _run(admin.main, argv, capsys)
    assert code == 0, err
    monkeypatch.setattr(common, "read_host_bound", lambda: KernelBound(False, 16 * US))
    monkeypatch.setenv("RASD_CLOCK_CHECK", "date")
    code, err = _run(admin.main, argv, capsys)
    assert code == 0, err
