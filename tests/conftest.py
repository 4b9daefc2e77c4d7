"""Shared fixtures: moto's server over real HTTP on loopback, a fresh table per test, uvloop.

Integration tests never use an in-process fake of the store: everything goes through
botocore/aiobotocore to ``ThreadedMotoServer`` on an ephemeral port.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import hypothesis
import hypothesis.strategies
import pytest
import uvloop

from rasd.core import schema

# The shared helpers assert too: pytest rewrites their asserts, as a test module's.
pytest.register_assert_rewrite("tests.helpers")

# --tier and --tier-record: the test tiers (tests/tiers.py, docs/testing.md)
pytest_plugins = ("tests.tiers",)

# hypothesis is imported here, at start-up (and used below): its pytest plugin otherwise imports
# it in the terminal summary, where CPython 3.11.7's compiler has failed with "AST constructor
# recursion depth mismatch" after a run of some integration test files alone.

# Dummy credentials: moto accepts anything, and no test may ever reach real AWS.
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
)
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("AWS_REGION", None)
os.environ.pop("AWS_ENDPOINT_URL", None)
os.environ.pop("AWS_ENDPOINT_URL_DYNAMODB", None)
# This machine's kernel keeps no synchronised clock (adjtimex: unsynchronised): daemons and
# jobs the tests start check theirs against moto's Date header alone (this host's clock).
os.environ.setdefault("RASD_CLOCK_CHECK", "date")


@pytest.fixture(scope="session", autouse=True)
def aws_settings_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The daemons' AWS settings cache (rasd.dynamo.awscache) in the session's temporary
    directory rather than the user's ~/.cache."""
    before = os.environ.get("CACHE_DIRECTORY")
    os.environ["CACHE_DIRECTORY"] = str(tmp_path_factory.mktemp("aws-settings-cache"))
    yield
    if before is None:
        os.environ.pop("CACHE_DIRECTORY", None)
    else:
        os.environ["CACHE_DIRECTORY"] = before


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Hypothesis's first draw of text builds its Unicode tables, and its first draw after
    modules were imported reads every module of this repository for constants; both are cached
    in .hypothesis/, which a clean clone lacks. That took 1.1-2.5 s here, which the too_slow
    health check charged to whichever property drew first, failing it. One draw of text once
    the tests are imported pays for both before any test runs."""
    if any(getattr(getattr(it, "obj", None), "is_hypothesis_test", False) for it in session.items):
        hypothesis.find(
            hypothesis.strategies.text(min_size=1),
            lambda _: True,
            settings=hypothesis.settings(database=None, max_examples=1),
        )


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server in a thread on 127.0.0.1, port picked by the OS (rasd.devtools.motoserver)."""
    from rasd.devtools import motoserver

    server, url = motoserver.start()  # conditional writes made atomic, as in DynamoDB
    yield url
    server.stop()


@pytest.fixture
def ddb(moto_endpoint: str) -> Any:
    """A plain boto3 DynamoDB client on the moto endpoint (for seeding and auditing)."""
    return boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")


_table_ids = itertools.count()


@pytest.fixture
def table(ddb: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh table (docs/schema.md), deleted afterwards (moto reads whole tables)."""
    name = f"t{os.getpid()}-{next(_table_ids)}"
    schema.create_table(ddb, name)
    yield name
    try:
        ddb.delete_table(TableName=name)
    except Exception:  # noqa: BLE001
        pass
