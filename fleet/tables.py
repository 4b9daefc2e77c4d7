"""The table: a boto3 client of the stand-ins, the table as seeded before a run, its items."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

from rasd.core import schema
from rasd.core.rollout import Rollout
from rasd_jobs import common as jobs_common

from .procs import FAKE_CREDENTIALS

#: botocore's retries unless the caller says otherwise
RETRIES = {"max_attempts": 8, "mode": "standard"}


def client(url: str, region: str, service: str = "dynamodb", **config: Any) -> Any:
    """A boto3 client of ``service`` at ``url``, signing for ``region`` with the fake
    credentials; ``config``: botocore's Config options (default: :data:`RETRIES`)."""
    return boto3.client(  # type: ignore[call-overload]
        service,
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=BotoConfig(**{"retries": RETRIES, **config}),
    )


def seed_table(
    ddb: Any,
    table: str,
    client_id: str,
    pool_id: str,
    resources: Mapping[str, Iterable[str]] | None = None,
    max_lease_s: float = 3600,
    now_us: int | None = None,
    rollout: tuple[str, str] | None = None,
    outage_budget: tuple[float, float] = (0.0, 0.0),
) -> None:
    """The table, the pool, and its free ``resources`` (names by region), all stamped
    ``now_us`` (default: now): the same call on every replica makes them alike. ``rollout``:
    the rollout record on, as ``rasadmin adopt`` leaves a table beside the paper's agent,
    written by (who, why). ``outage_budget``: the pool's (budget, quarantine), seconds."""
    schema.create_table(ddb, table)
    schema.put_pool(ddb, table, client_id, pool_id, max_lease_s, None, *outage_budget)
    for region, names in (resources or {}).items():
        schema.add_resources(ddb, table, client_id, pool_id, region, names, now_us)
    if rollout is not None:
        jobs_common.write_rollout(ddb, table, True, Rollout(), *rollout)


def items(ddb: Any, operation: str, **kw: Any) -> Iterator[dict[str, Any]]:
    """Every item a ``scan`` or ``query`` with ``kw`` returns, page after page."""
    for page in ddb.get_paginator(operation).paginate(**kw):
        yield from page.get("Items", [])


def scan(ddb: Any, table: str, **kw: Any) -> list[dict[str, Any]]:
    """Every item of ``table``, strongly consistent; ``kw``: more of Scan's parameters."""
    return list(items(ddb, "scan", TableName=table, ConsistentRead=True, **kw))
