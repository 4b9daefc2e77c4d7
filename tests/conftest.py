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
import hypothesis  # noqa: F401 - see below
import pytest
import uvloop

from rasd.core import schema

# hypothesis is imported here, at start-up: its pytest plugin otherwise imports it in the
# terminal summary, where CPython 3.11.7's compiler has failed with "AST constructor recursion
# depth mismatch" after a run of some integration test files alone.

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


def seed_pool(
    ddb: Any,
    table: str,
    client_id: str = "demo",
    pool_id: str = "default",
    region: str = "us-east-1",
    count: int = 20,
    max_lease_s: float = 7200,
    prefix: str = "res-",
) -> list[str]:
    """Define a pool and add ``count`` free resources to ``region``; returns their names."""
    schema.put_pool(ddb, table, client_id, pool_id, max_lease_s)
    names = [f"{prefix}{i:05d}" for i in range(count)]
    schema.add_resources(ddb, table, client_id, pool_id, region, names)
    return names


def scan_all(ddb: Any, table: str) -> list[dict[str, Any]]:
    """Every item of ``table`` (consistent reads), through boto3's Scan paginator."""
    pages = ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return [item for page in pages for item in page["Items"]]


def hold(
    ddb: Any,
    table: str,
    resource: str,
    key: str,
    expires_us: int,
    now_us: int,
    client_id: str = "demo",
    token: str | None = None,
) -> str:
    """Lease ``resource`` to ``key`` exactly as a daemon does (docs/design.md): the mapping
    item at the version read, the claim with the same token, then the confirmation. Returns
    the token. Leasing a key again in the same region leaves the earlier resource an orphan,
    as a crash can."""
    from rasd.core import builders as B
    from rasd.core import lease as L
    from rasd.core import map_builders as MB
    from rasd.core import serialize as S
    from rasd.core.writes import item_from_av, key_av, render

    raw = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": client_id}, "resource": {"S": resource}},
        ConsistentRead=True,
    )["Item"]
    item = S.item_from_ddb(raw)
    ident = (L.map_pk(client_id, item.pool_id, key), item.region)
    got = ddb.get_item(TableName=table, Key=key_av(ident), ConsistentRead=True).get("Item")
    ver = S.mapping_from(item_from_av(got)).ver if got else 0
    tok = token or f"tok-{resource}-{ver}"
    w = MB.map_acquire(ident, ver, tok, resource, item.version, expires_us, now_us, "test")
    ddb.update_item(TableName=table, **render(w))
    ddb.update_item(TableName=table, **render(B.claim(item, key, expires_us, now_us, tok, ver + 1)))
    m = L.Mapping(
        client_id,
        item.pool_id,
        key,
        item.region,
        ver + 1,
        L.PENDING,
        tok,
        resource,
        item.version,
        expires_us,
        now_us,
    )
    ddb.update_item(TableName=table, **render(MB.map_confirm(m)))
    return tok


def rollout_on(ddb: Any, table: str) -> None:
    """Put ``table`` in rollout mode, as ``rasadmin adopt`` does first: the paper's agent may
    write it, and every rasd daemon and job keeps the rules that are safe beside it."""
    from rasd_jobs import common

    assert common.write_rollout(ddb, table, True, common.read_rollout(ddb, table), "test", "test")
