"""moto's server started with RASD_MOTO_STALLS (the flake hunt's slow DynamoDB): its answers
come late."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest

from rasd.devtools import motoserver

pytestmark = pytest.mark.integration


def test_every_request_waits_for_its_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RASD_MOTO_STALLS", "1:0.3")
    server, url = motoserver.start()
    try:
        ddb: Any = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")
        t0 = time.monotonic()
        assert isinstance(ddb.list_tables()["TableNames"], list)  # moto's one backend: any
        assert time.monotonic() - t0 >= 0.3
    finally:
        server.stop()
