"""Opening the DynamoDB client a ``Store`` calls, by ``ddb_client``: the lean one
(``rasd.dynamo.ddb``), which reports every answer's Date header to ``on_date`` (the daemon's
clock watch, ``rasd.server.clockwatch``), or aiobotocore's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..config import Config
from .aws import AwsSettings

OnDate = Callable[[bytes, float], None]


async def open_client(
    cfg: Config, region: str, on_date: OnDate | None
) -> tuple[Any, Any, AwsSettings]:
    """(the context to close, the client, the AWS settings in effect). Raises
    ``rasd.dynamo.aws.AwsSettingsError`` for an AWS setting rasd cannot honour."""
    from . import aws

    if cfg.ddb_client == "lean":
        from .ddb import LeanDynamoDB

        # credentials, then the settings (the endpoint may depend on their account)
        client = await LeanDynamoDB.create(
            cfg.endpoint_url,
            region,
            max_connections=cfg.ddb_max_connections,
            connect_timeout=cfg.ddb_connect_timeout,
            read_timeout=cfg.ddb_read_timeout,
            max_age=cfg.ddb_connection_max_age,
            on_date=on_date,
        )
        return client, client, client.settings
    # the checks and the retry settings (aiobotocore resolves the rest itself)
    settings = await asyncio.to_thread(aws.resolve, cfg.endpoint_url, region)
    # aioboto3 takes about a second to import: only this path pays for it
    import aioboto3
    from aiobotocore.config import AioConfig

    session = aioboto3.Session()
    ctx = session.client(
        "dynamodb",
        region_name=region,
        endpoint_url=cfg.endpoint_url,
        config=AioConfig(
            max_pool_connections=cfg.ddb_max_connections,
            connect_timeout=cfg.ddb_connect_timeout,
            read_timeout=cfg.ddb_read_timeout,
            retries={"max_attempts": 1, "mode": "standard"},  # we retry, within deadlines
            tcp_keepalive=True,
            connector_args={"keepalive_timeout": 60.0},
        ),
    )
    client = await ctx.__aenter__()  # its answers' Date: ``Store._call`` reads them
    return ctx, client, settings
