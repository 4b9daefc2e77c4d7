"""rasadmin's exit status, held to docs/operations.md's table for every command its parser has
(a new command fails here until the table lists it), and what needs no DynamoDB: a usage error
exits 2, a bad or missing region exits 2 with what to do before any client is made, and
rasadmin's client gives up on an endpoint it cannot connect to within seconds, where the jobs'
retries ride out a minute."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import structlog
from botocore.endpoint import Endpoint
from botocore.exceptions import EndpointConnectionError

from rasd_jobs import common
from tests.helpers.admin_cli import (
    USAGE_BEFORE_DYNAMODB,
    commands,
    exit_table,
    least_argv,
    run,
    takes,
)
from tests.helpers.aws import AWS_VARS

pytestmark = pytest.mark.usefixtures("one_botocore_loader")

COMMANDS = sorted(commands())


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """main() configures structlog for a CLI process; put the session's setup back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def no_region(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials and an endpoint, but no region anywhere: no variable, no config file, and a
    fresh default session (a cached one may have read a region)."""
    for var in (*AWS_VARS, "AWS_REGION", "AWS_DEFAULT_REGION", "RASD_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:9")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)


@pytest.fixture
def no_client(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("no DynamoDB client may be made")

    monkeypatch.setattr(boto3, "client", refuse)


def test_the_table_lists_every_command_and_no_other() -> None:
    rows = exit_table()
    assert sorted(rows) == COMMANDS
    for name, cells in rows.items():
        assert len(cells) == 3 and cells[0], (name, cells)  # what 0 means, always said


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unknown_flag_exits_2(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([*least_argv(name, commands()[name]), "--no-such-flag"], capsys)
    assert code == 2 and "unrecognized arguments: --no-such-flag" in err, err


def test_a_missing_required_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    checked = 0
    for name, parser in commands().items():
        argv = least_argv(name, parser)
        if len(argv) > 1:  # a command with a required flag: leave its last one out
            code, _, err = run(argv[:-2], capsys)
            assert code == 2 and "required" in err, (name, err)
            checked += 1
    assert checked >= 8


@pytest.mark.usefixtures("no_client")
@pytest.mark.parametrize("name", COMMANDS)
def test_a_bad_region_exits_2_before_any_client(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run([*least_argv(name, commands()[name]), "--region", "EU-West"], capsys)
    assert code == 2, err
    assert "rasadmin: error: bad region 'EU-West'" in err, err


@pytest.mark.usefixtures("no_region")
@pytest.mark.parametrize("name", COMMANDS)
def test_no_region_at_all_exits_2_saying_what_to_set(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """boto3's own words would be "You must specify a region", exit 1."""
    code, _, err = run(least_argv(name, commands()[name]), capsys)
    assert code == 2, err
    assert "rasadmin: error: no region: pass --region or set RASD_REGION" in err, err
    assert "You must specify a region" not in err


@pytest.mark.parametrize(("argv", "said"), USAGE_BEFORE_DYNAMODB, ids=lambda x: str(x)[:40])
def test_a_commands_own_usage_errors_exit_2_before_dynamodb(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's third column, where no read comes first (AWS_REGION gives the client its
    region; the RAS region is unset)."""
    monkeypatch.delenv("RASD_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")

    def no_call(*_: Any, **__: Any) -> Any:
        raise AssertionError("DynamoDB may not be asked")

    monkeypatch.setattr(Endpoint, "make_request", no_call)
    code, _, err = run([*argv, "--endpoint-url", "http://127.0.0.1:9"], capsys)
    assert code == 2, err
    assert "rasadmin: error: " in err and said in err, err
    assert argv[0] in exit_table() and exit_table()[argv[0]][2], argv


def test_every_command_takes_the_region_and_endpoint_flags() -> None:
    """The hints above name flags each command has."""
    for name, parser in commands().items():
        assert takes(parser, "--region") and takes(parser, "--endpoint-url"), name


def _connect_failed(client: Any, attempts: int) -> list[Any]:
    """What the client's retry handlers answer after ``attempts`` failed connects."""
    exc = EndpointConnectionError(endpoint_url=client.meta.endpoint_url)
    answers: list[Any] = client.meta.events.emit(
        "needs-retry.dynamodb.ListTables",
        response=None,
        endpoint=None,
        operation=client.meta.service_model.operation_model("ListTables"),
        attempts=attempts,
        caught_exception=exc,
        request_dict={"context": {}},
    )
    return answers


def test_rasadmins_client_connects_twice_3_s_each_the_jobs_as_before() -> None:
    """An endpoint that does not answer (a forgotten --endpoint-url means AWS's) costs a
    rasadmin command seconds, not the minute of backoff a job rides out a blip with."""
    quick = common.client_for("http://127.0.0.1:9", "us-east-1", interactive=True)
    job = common.client_for("http://127.0.0.1:9", "us-east-1")
    assert quick.meta.config.connect_timeout == common.INTERACTIVE_CONNECT_TIMEOUT == 3
    assert job.meta.config.connect_timeout == 5
    assert any(r is not None for _, r in _connect_failed(quick, 1))  # one retry
    with pytest.raises(EndpointConnectionError):
        _connect_failed(quick, common.INTERACTIVE_CONNECT_ATTEMPTS)
    assert any(r is not None for _, r in _connect_failed(job, 5))  # retried on


def test_a_failed_connect_names_the_endpoint_region_and_where_it_comes_from() -> None:
    exc = EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com/")
    exc.rasd_where = {  # type: ignore[attr-defined]
        "endpoint": "https://dynamodb.us-east-1.amazonaws.com",
        "region": "us-east-1",
    }
    said = common.unreachable(exc)
    assert said.startswith(
        "cannot connect to DynamoDB at https://dynamodb.us-east-1.amazonaws.com (region us-east-1)"
    ), said
    assert "--endpoint-url" in said and "AWS_ENDPOINT_URL_DYNAMODB" in said
