"""rasadmin's exit status against a table (docs/operations.md, "rasadmin's exit status"): an
endpoint that does not answer fails every command within seconds, naming the endpoint and the
region tried; a pool that does not exist is said alike by every command that names one (exit
1); and add-pool prints its seconds as one type."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from tests.helpers.admin_cli import (
    USAGE_AFTER_READING,
    USAGE_BEFORE_DYNAMODB,
    commands,
    exit_table,
    least_argv,
    run,
    takes,
)
from tests.helpers.tables import scan_all, seed_pool

pytestmark = [pytest.mark.integration]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (connects are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_every_command_names_the_endpoint_it_cannot_reach(
    closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 1 within seconds (a job's client retries for about a minute), with the endpoint
    and region tried and where the endpoint comes from."""
    url = f"http://127.0.0.1:{closed_port}"
    for name, parser in sorted(commands().items()):
        argv = [*least_argv(name, parser), "--endpoint-url", url, "--region", "us-east-1"]
        started = time.monotonic()
        code, _, err = run(argv, capsys)
        took = time.monotonic() - started
        assert code == 1, (name, err)
        assert f"cannot connect to DynamoDB at {url} (region us-east-1)" in err, (name, err)
        assert "AWS_ENDPOINT_URL_DYNAMODB" in err and "Traceback" not in err, (name, err)
        assert took < 8, (name, took)


def test_every_command_says_no_pool_alike(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stats --client demo --pool nope` says what show-pool says, `no pool demo/nope in table
    T`, and exits 1, as does every command naming a pool; an empty listing of a pool that
    exists is `(none)`, exit 0."""
    seed_pool(ddb, table, count=3)
    where = ["--table", table, "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    named = 0
    for name, parser in sorted(commands().items()):
        if name == "add-pool" or not takes(parser, "--pool"):
            continue  # add-pool defines the pool it names
        base = least_argv(name, parser)
        flags = dict(zip(base[1::2], base[2::2], strict=True))
        flags.update({"--client": "demo", "--pool": "nope"})
        argv = [name, *[x for kv in flags.items() for x in kv], *where]
        code, out, err = run(argv, capsys)
        assert code == 1, (name, out, err)
        assert f"rasadmin: error: no pool demo/nope in table {table}" in err, (name, err)
        assert "(none)" not in out, name
        named += 1
    assert named >= 5
    code, _, err = run(["stats", "--pool", "nope", *where], capsys)
    assert code == 1 and f"no pool nope of any client in table {table}" in err, err
    for argv in (
        ["stats", "--client", "demo", "--pool", "default"],
        ["list-resources", "--client", "demo", "--pool", "default", "--leased"],
        ["stats", "--client", "nobody"],
    ):
        code, out, err = run([*argv, *where], capsys)
        assert code == 0, (argv, err)
    assert out == "(none)\n"  # a listing that is empty is no error


def test_a_commands_own_usage_errors_after_reading_exit_2(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's third column, where the pool is read first: exit 2 and nothing written.
    With the unit test's cases, every command whose row has such errors is tried."""
    seed_pool(ddb, table, count=2)
    before = scan_all(ddb, table)
    where = ["--table", table, "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    for argv, said in USAGE_AFTER_READING:
        code, _, err = run([*argv, *where], capsys)
        assert code == 2 and f"rasadmin: error: {said}" in err, (argv, err)
    assert scan_all(ddb, table) == before
    tried = {argv[0] for argv, _ in USAGE_BEFORE_DYNAMODB + USAGE_AFTER_READING}
    assert tried == {name for name, cells in exit_table().items() if cells[2]}


def test_add_pool_prints_whole_seconds_as_an_int(
    table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--max-lease 7200` prints `"max_lease": 7200` (not 7200.0), as the default prints
    86400 and list-pools prints them."""
    where = ["--table", table, "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    pool = ["--client", "demo"]
    cases: tuple[tuple[list[str], float], ...] = (
        ([], 86400),
        (["--max-lease", "7200"], 7200),
        (["--max-lease", "1.5"], 1.5),
    )
    for i, (flags, want) in enumerate(cases):
        code, out, err = run(["add-pool", *pool, "--pool", f"p{i}", *flags, *where], capsys)
        assert code == 0, err
        got = json.loads(out)["max_lease"]
        assert got == want and type(got) is type(want), out
        assert f'"max_lease": {want},' in out, out
    code, out, _ = run(["list-pools", "--json", *where], capsys)
    assert [p["max_lease"] for p in json.loads(out)] == [86400, 7200, 1.5]
    assert '"max_lease": 7200,' in out
