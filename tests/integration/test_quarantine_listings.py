"""A quarantined resource is listed as quarantined, not free; the daemon's NO_CAPACITY says how
many are in quarantine and until when.

After ``rasadmin release-resource`` (claimable again only an hour ahead) ``rasadmin stats``
counted the item under FREE, and ``list-resources --free`` and ``show-resource`` said
``"state": "free"`` with no ``quarantine_until``, while the daemon answered NO_CAPACITY with
nothing to explain it. An item is quarantined when it carries ``quarantine_until`` (out of the
available index until it is re-listed) or a ``lease_available`` in the future.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
import structlog

import rasd_client
from rasd.config import Config
from rasd.core.lease import US, fmt_time
from rasd_jobs import admin
from tests.helpers.tables import hold, seed_pool

pytestmark = pytest.mark.integration

NOW = 1_800_000_000 * US
HOUR = 3600 * US
SKEW = int(Config().max_clock_skew * US)


@pytest.fixture(autouse=True)
def _restore_logging() -> Any:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def rasadmin(
    capsys: pytest.CaptureFixture[str], endpoint: str, table: str, *argv: str
) -> tuple[int, str]:
    code = admin.main([*argv, "--table", table, "--endpoint-url", endpoint])
    out, err = capsys.readouterr()
    assert code == 0, (argv, out, err)
    return code, out


def test_listings_tell_claimable_from_quarantined(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_pool(ddb, table, count=3)  # res-00000..2, claimable since before NOW
    hold(ddb, table, "res-00000", "k", NOW + HOUR, NOW)
    ddb.update_item(  # a lease_available in the future: not claimable yet either
        TableName=table,
        Key={"client_id": {"S": "demo"}, "resource": {"S": "res-00001"}},
        UpdateExpression="SET lease_available = :t",
        ExpressionAttributeValues={":t": {"S": fmt_time(NOW + 600 * US)}},
    )

    def run(*argv: str, now: int = NOW) -> str:
        return rasadmin(capsys, moto_endpoint, table, *argv, "--now", str(now / US))[1]

    rel = ["release-resource", "--region", "us-east-1", "--client", "demo"]
    released = json.loads(run(*rel, "--resource", "res-00000"))
    until = fmt_time(NOW + HOUR + SKEW)
    assert released["claimable_from"] == until

    (row,) = json.loads(run("stats", "--json"))
    counts = {k: row[k] for k in ("free", "claimable", "quarantined", "leased", "expired")}
    assert counts == {"free": 3, "claimable": 1, "quarantined": 2, "leased": 0, "expired": 0}
    assert row["total"] == 3
    head = run("stats").splitlines()[0].split()
    assert head[3:] == ["FREE", "CLAIMABLE", "QUARANTINED", "LEASED", "EXPIRED", "TOTAL"]

    def listing(*flags: str) -> dict[str, dict[str, Any]]:
        rows = json.loads(run("list-resources", "--client", "demo", "--json", *flags))
        return {r["resource"]: r for r in rows}

    assert set(listing("--free")) == {"res-00002"}
    quarantined = listing("--quarantined")
    assert set(quarantined) == {"res-00000", "res-00001"}
    assert quarantined["res-00000"]["quarantine_until"] == until
    assert quarantined["res-00000"]["claimable_from"] == until
    assert quarantined["res-00001"]["quarantine_until"] is None
    assert quarantined["res-00001"]["claimable_from"] == fmt_time(NOW + 600 * US)
    assert "QUARANTINE_UNTIL" in run("list-resources", "--client", "demo").splitlines()[0]

    shown = json.loads(
        run("show-resource", "--client", "demo", "--resource", "res-00000", "--json")
    )
    assert (shown["state"], shown["quarantine_until"]) == ("quarantined", until)
    text = run("show-resource", "--client", "demo", "--resource", "res-00000")
    assert any(line.split() == ["quarantine_until", until] for line in text.splitlines())

    pool = json.loads(run("show-pool", "--client", "demo", "--pool", "default", "--json"))
    (region,) = pool["regions"]
    assert (region["free"], region["claimable"], region["quarantined"]) == (3, 1, 2)

    # past its quarantine, an item stays quarantined until it is re-listed (in no index)
    later = NOW + HOUR + SKEW + 60 * US
    rows = json.loads(run("list-resources", "--client", "demo", "--json", now=later))
    assert {r["resource"]: r["state"] for r in rows} == {
        "res-00000": "quarantined",
        "res-00001": "free",
        "res-00002": "free",
    }


async def test_no_capacity_says_how_many_are_in_quarantine_and_until_when(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    make_daemon: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The pool's one resource, released by rasadmin: the daemon's NO_CAPACITY names the
    quarantine and its end (the release's ``claimable_from``)."""
    seed_pool(ddb, table, count=1)
    async with make_daemon() as d:
        sock = d.cfg.socket

        def get(key: str) -> rasd_client.Lease:
            return rasd_client.get_lease(
                "demo", "default", key, timedelta(hours=1), socket_path=sock, timeout=5
            )

        held = await asyncio.to_thread(get, "k1")
        argv = ["release-resource", "--region", "us-east-1", "--client", "demo"]
        _, out = await asyncio.to_thread(
            rasadmin, capsys, moto_endpoint, table, *argv, "--resource", held.resource
        )
        until = json.loads(out.strip().splitlines()[-1])["claimable_from"]
        with pytest.raises(rasd_client.NoCapacity) as got:
            await asyncio.to_thread(get, "k2")
        assert f"1 in quarantine (until {until}" in got.value.message, got.value.message
        with pytest.raises(rasd_client.NoCapacity) as again:  # from memory, the same words
            await asyncio.to_thread(get, "k3")
        assert f"1 in quarantine (until {until}" in again.value.message
