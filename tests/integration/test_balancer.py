"""``ras-balancer`` against moto's server over HTTP: DynamoDB, DynamoDB Streams and S3 on the
one endpoint. One table stands in for the global table (every region's items in it), as the
docs/operations.md allows; time is passed in (``Options.now_us`` / ``--now``), never slept."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
import structlog
from botocore.exceptions import ClientError

from rasd.core import builders, lease
from rasd.core.lease import US
from rasd.core.serialize import item_from_ddb
from rasd.core.writes import render
from rasd_jobs import balance_model, balancer, s3state
from tests.helpers.tables import scan_all, seed_pool

pytestmark = pytest.mark.integration

from tests.helpers.balancer import T0, A, E, W, claim_n  # noqa: E402

STEP = 300 * US
_buckets = itertools.count()


# ------------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """``main()`` binds structlog to the sys.stderr of the moment (pytest's capture, closed
    after the test); put the defaults back so later tests' logs have somewhere to go."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def state_uri(s3: Any, table: str) -> str:
    bucket = f"rasd-state-{table.lower()}-{next(_buckets)}"
    s3.create_bucket(Bucket=bucket)
    return f"s3://{bucket}/balancer"


@pytest.fixture
def clients(ddb: Any, s3: Any, moto_endpoint: str) -> balancer.Clients:
    streams = boto3.client("dynamodbstreams", endpoint_url=moto_endpoint, region_name="us-east-1")
    return balancer.Clients(ddb=ddb, streams=streams, s3=s3)


def opts(table: str, state_uri: str | None, now_us: int, **kw: Any) -> balancer.Options:
    kw.setdefault("regions", (E, W))
    kw.setdefault("unreplicated", True)  # one table stands in for every replica
    return balancer.Options(table=table, region=E, now_us=now_us, state_uri=state_uri, **kw)


def free_count(ddb: Any, table: str, region: str, client: str = "demo", pool: str = "default"):
    return balancer.count_free(ddb, table, client, pool, region)


def resource_items(ddb: Any, table: str) -> dict[str, dict[str, Any]]:
    return {
        it["resource"]["S"]: it for it in scan_all(ddb, table) if it["client_id"]["S"] == "demo"
    }


class Hooked:
    """A boto3 client wrapper that runs ``hook(kwargs)`` before the first call of ``op`` that
    ``match(kwargs)`` accepts: how tests put a claim (or another balancer) between the
    balancer's read and its write."""

    def __init__(
        self, inner: Any, op: str, match: Callable[[dict[str, Any]], bool], hook: Callable
    ) -> None:
        self._inner, self._op, self._match, self._hook = inner, op, match, hook
        self.fired = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._inner, name)
        if name != self._op:
            return real

        def call(**kw: Any) -> Any:
            if not self.fired and self._match(kw):
                self.fired += 1
                self._hook(kw)
            return real(**kw)

        return call


def is_move(kw: dict[str, Any]) -> bool:
    """The balancer's move: the only write that sets ``partition`` (rasd.core.builders.move)."""
    return "partition" in kw.get("ExpressionAttributeNames", {}).values()


# --------------------------------------------------------------------------------- tests
def test_moto_stream_carries_the_tables_writes(
    ddb: Any, table: str, clients: balancer.Clients, state_uri: str
) -> None:
    """moto's DynamoDB stream works with the table ``rasd.core.schema.create_table`` makes: the
    balancer sees every write since the table was created, and the claims as acquisitions."""
    seed_pool(ddb, table, region=E, count=20)
    claim_n(ddb, table, E, 6, T0)
    s = balancer.run(opts(table, state_uri, T0), clients)
    assert s["status"] == "ok"
    # pool item, 20 inserts, 6 claims, and this run's lock: moto records an UpdateItem that
    # creates an item as two INSERTs (the key alone, then the item), see docs/global.md
    assert s["stream_records"] == 1 + 20 + 6 + 2
    assert s["acquisitions"] == 6
    again = balancer.run(opts(table, state_uri, T0 + STEP), clients)
    # resumed from the checkpoint on S3: only the balancer's own meta writes since then
    # (2 headroom items, lock dropped; this run's lock) and no acquisition
    assert (again["stream_records"], again["acquisitions"]) == (4, 0)


def test_demand_moves_free_items_to_the_busy_region_never_leased_ones(
    ddb: Any, table: str, clients: balancer.Clients, state_uri: str
) -> None:
    """Acquisitions in us-east-1 make the balancer move free items there from eu-west-1;
    leased items (in either region) are never moved, their leases untouched."""
    seed_pool(ddb, table, region=E, count=10, prefix="e-")
    seed_pool(ddb, table, region=W, count=60, prefix="w-")
    held_w = claim_n(ddb, table, W, 5, T0, prefix="w")
    first = balancer.run(opts(table, state_uri, T0), clients)  # learns the quiet baseline
    assert first["moved"] == 0
    held_e = claim_n(ddb, table, E, 8, T0 + STEP, prefix="e")
    before = resource_items(ddb, table)

    s = balancer.run(opts(table, state_uri, T0 + STEP), clients)

    assert s["acquisitions"] == 8
    assert s["moves_planned"] > 0 and s["moved"] == s["moves_planned"]
    after = resource_items(ddb, table)
    moved = {r for r in after if after[r]["region"]["S"] != before[r]["region"]["S"]}
    assert len(moved) == s["moved"]
    for r in moved:
        assert before[r]["region"]["S"] == W and after[r]["region"]["S"] == E
        assert "key" not in before[r] and "key" not in after[r]
        assert after[r]["partition"]["S"].startswith("demo.default.us-east-1.")
        assert int(after[r]["version"]["N"]) == int(before[r]["version"]["N"]) + 1
    for it in held_w + held_e:
        assert after[it.resource] == before[it.resource]  # leases untouched
    # us-east-1 now holds its target of free items
    plan_target = 2 + int(-(-balance_model.Holt(0).update(8, 0.4, 0.2).project(2) * 1.5 // 1))
    assert free_count(ddb, table, E) == plan_target
    assert free_count(ddb, table, W) == 55 - s["moved"]


def test_move_racing_a_claim_leaves_exactly_one_owner(
    ddb: Any, table: str, clients: balancer.Clients, state_uri: str
) -> None:
    """A daemon claims an item between the balancer's read and its move: the move loses
    (conditional on version and free), the claim stands, the race is counted, and the
    balancer still moves the planned number with a spare candidate."""
    seed_pool(ddb, table, region=W, count=30)
    raced: list[str] = []

    def claim_it(kw: dict[str, Any]) -> None:
        raw = ddb.get_item(TableName=table, Key=kw["Key"], ConsistentRead=True)["Item"]
        it = item_from_ddb(raw)
        w = builders.claim(it, "winner", T0 + 3600 * US, T0, "tok-winner", 1)
        ddb.update_item(TableName=table, **render(w))
        raced.append(it.resource)

    clients.ddb = Hooked(ddb, "update_item", is_move, claim_it)
    s = balancer.run(opts(table, state_uri, T0), clients)

    assert raced and s["lost_races"] == 1
    assert s["moves_planned"] == 2 and s["moved"] == 2  # the floor of the empty region
    items = resource_items(ddb, table)
    won = items[raced[0]]
    assert won["key"]["S"] == "winner" and won["region"]["S"] == W
    holders = ddb.query(
        TableName=table,
        IndexName="leased_resources",
        KeyConditionExpression="#k = :k",
        ExpressionAttributeNames={"#k": "key"},
        ExpressionAttributeValues={":k": {"S": "winner"}},
    )["Items"]
    assert [h["resource"]["S"] for h in holders] == [raced[0]]
    assert all("key" not in it for it in items.values() if it["region"]["S"] == E)


def test_state_on_s3_survives_a_crash_between_runs(
    ddb: Any, table: str, clients: balancer.Clients, s3: Any, state_uri: str
) -> None:
    """A run that dies after writing its new state object but before moving the pointer
    leaves the previous state readable; the next run resumes from the old checkpoints, so the
    records the crashed run read are counted once, not lost."""
    seed_pool(ddb, table, region=E, count=10)
    balancer.run(opts(table, state_uri, T0), clients)
    loc = s3state.parse_uri(state_uri)
    good, _ = s3state.load(s3, loc)
    assert good is not None and good["last_run_us"] == T0

    claim_n(ddb, table, E, 3, T0)

    class Crash(Exception):
        pass

    def crash(kw: dict[str, Any]) -> None:
        raise Crash("killed between the state object and the pointer")

    crashing = balancer.Clients(
        ddb=ddb,
        streams=clients.streams,
        s3=Hooked(s3, "put_object", lambda kw: kw["Key"].endswith("latest.json"), crash),
    )
    with pytest.raises(Crash):
        balancer.run(opts(table, state_uri, T0 + STEP), crashing)

    kept, _ = s3state.load(s3, loc)
    assert kept == good
    listed = s3.list_objects_v2(Bucket=loc.bucket, Prefix=loc.key("runs/"))["Contents"]
    assert len(listed) == 4  # the orphaned new state+snapshot exist, unreferenced
    s = balancer.run(opts(table, state_uri, T0 + 2 * STEP), clients)  # lock was released
    assert s["status"] == "ok"
    assert s["acquisitions"] == 3
    latest, _ = s3state.load(s3, loc)
    assert latest is not None and latest["last_run_us"] == T0 + 2 * STEP
    _, pointer = s3state.load(s3, loc)
    assert pointer is not None
    snap = json.loads(s3.get_object(Bucket=loc.bucket, Key=pointer["snapshot"])["Body"].read())
    assert snap["pools"][f"demo.default.{E}"]["window"]["acquired"] == 3


def test_lock_prevents_two_concurrent_balancers(
    ddb: Any, table: str, clients: balancer.Clients, state_uri: str
) -> None:
    """A second balancer started while one is moving finds the lock held and does nothing;
    after the first ends, the lock is free again; a crashed holder's lock expires."""
    seed_pool(ddb, table, region=W, count=30)
    nested: list[dict[str, Any]] = []

    def second_balancer(kw: dict[str, Any]) -> None:
        nested.append(balancer.run(opts(table, state_uri, T0 + 1), clients))

    first_clients = balancer.Clients(
        ddb=Hooked(ddb, "update_item", is_move, second_balancer),
        streams=clients.streams,
        s3=clients.s3,
    )
    s = balancer.run(opts(table, state_uri, T0), first_clients)
    assert s["status"] == "ok" and s["moved"] == 2
    assert nested[0]["status"] == "locked" and "moved" not in nested[0]

    assert balancer.run(opts(table, state_uri, T0 + STEP), clients)["status"] == "ok"

    assert balancer.take_lock(ddb, table, "crashed-run", T0 + 2 * STEP, 240) is None
    blocked = balancer.run(opts(table, state_uri, T0 + 2 * STEP + 60 * US), clients)
    assert blocked == {"status": "locked", "holder": "crashed-run", "seconds": blocked["seconds"]}
    expired = balancer.run(opts(table, state_uri, T0 + 2 * STEP + 241 * US), clients)
    assert expired["status"] == "ok"


def test_dry_run_writes_nothing(
    ddb: Any,
    table: str,
    s3: Any,
    state_uri: str,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--dry-run`` prints the plan in its one-line summary and leaves the table (items,
    lock, headroom) and the S3 state exactly as they were."""
    seed_pool(ddb, table, region=W, count=30)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    before = scan_all(ddb, table)
    argv = [
        "--table", table, "--region", E, "--regions", f"{E},{W}", "--endpoint-url",
        moto_endpoint, "--state-uri", state_uri, "--now", str(T0 // US), "--dry-run",
        "--unreplicated",
    ]  # fmt: skip
    assert balancer.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    summary = json.loads(out[0])
    assert summary["dry_run"] and summary["moved"] == 0
    assert summary["plan"] == [
        {"client": "demo", "pool": "default", "from": W, "to": E, "count": 2}
    ]
    assert scan_all(ddb, table) == before
    loc = s3state.parse_uri(state_uri)
    assert s3.list_objects_v2(Bucket=loc.bucket).get("KeyCount", 0) == 0


def test_cli_run_summary_and_headroom_items(
    ddb: Any,
    table: str,
    state_uri: str,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real run from the command line: exit 0, the summary's fields, and one headroom item
    per (client, pool, region) with free, projected demand and headroom = free - demand."""
    seed_pool(ddb, table, region=W, count=30)
    claim_n(ddb, table, W, 4, T0)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    argv = [
        "--table", table, "--region", E, "--regions", f"{W},{E}", "--endpoint-url",
        moto_endpoint, "--state-uri", state_uri, "--now", str(T0 // US), "--unreplicated",
    ]  # fmt: skip
    assert balancer.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    for f in ("pools", "regions", "moves_planned", "moved", "lost_races", "stream_records"):
        assert f in summary
    assert summary["pools"] == 1 and summary["regions"] == sorted([E, W])
    assert summary["misses"] == 0 and isinstance(summary["seconds"], float)
    for region in (E, W):
        it = ddb.get_item(
            TableName=table,
            Key={"client_id": {"S": "#meta"}, "resource": {"S": f"headroom#demo#default#{region}"}},
        )["Item"]
        free = int(it["free"]["N"])
        assert free == free_count(ddb, table, region)
        assert int(it["headroom"]["N"]) == free - int(it["projected_demand"]["N"])
        assert it["updated"]["S"] == lease.fmt_time(T0)
    west = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": "#meta"}, "resource": {"S": f"headroom#demo#default#{W}"}},
    )["Item"]
    assert int(west["projected_demand"]["N"]) == 8  # 4 acquisitions per interval, 2 intervals


def test_reported_misses_count_as_demand(
    ddb: Any, table: str, clients: balancer.Clients, state_uri: str
) -> None:
    """NO_CAPACITY writes nothing, so the daemons' miss counters are the only sign of unmet
    demand: misses reported in us-east-1 (which has no free items) move items there."""
    seed_pool(ddb, table, region=W, count=100)
    report = balance_model.miss_report_update("demo", "default", E, "host-a:1", 5, T0)
    ddb.update_item(TableName=table, **report)
    first = balancer.run(opts(table, state_uri, T0), clients)
    assert first["misses"] == 0  # first run: the counters are only a baseline
    for daemon, n in (("host-a:1", 12), ("host-b:7", 8)):
        upd = balance_model.miss_report_update("demo", "default", E, daemon, n, T0)
        if daemon == "host-b:7":  # a daemon of an older version reports under #meta
            upd["Key"] = {**upd["Key"], "client_id": {"S": "#meta"}}
        ddb.update_item(TableName=table, **upd)
    s = balancer.run(opts(table, state_uri, T0 + STEP), clients)
    assert s["misses"] == 20  # both read
    # demand 20 per interval, Holt from 0: level 8, trend 1.6 -> 2*8 + 3*1.6 = 20.8 -> 21
    assert free_count(ddb, table, E) == 2 + 32  # floor + ceil(20.8 * 1.5)
    assert s["moved"] == 32


def test_three_regions_donor_with_highest_ratio_gives(
    ddb: Any, table: str, clients: balancer.Clients, state_uri: str
) -> None:
    """With three regions, the region with the highest free/target ratio gives first, and the
    other donor is left alone while the first has the higher ratio."""
    seed_pool(ddb, table, region=W, count=10, prefix="w-")
    seed_pool(ddb, table, region=A, count=40, prefix="a-")
    s = balancer.run(opts(table, state_uri, T0, regions=(E, W, A)), clients)
    assert s["moved"] == 2
    assert free_count(ddb, table, A) == 38 and free_count(ddb, table, W) == 10
    assert free_count(ddb, table, E) == 2


def test_peer_endpoint_moves_in_the_donor_replica(
    ddb: Any, table: str, clients: balancer.Clients, state_uri: str
) -> None:
    """With a peer client for the donor region, that region's candidates are read and moved
    through it (its replica orders the move with its own daemons' claims), not the home one."""
    seed_pool(ddb, table, region=W, count=30)
    calls: list[str] = []

    class Peer:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(ddb, name)

    home = Hooked(ddb, "update_item", is_move, lambda kw: pytest.fail("move sent to home"))
    peered = balancer.Clients(ddb=home, streams=clients.streams, s3=clients.s3, peers={W: Peer()})
    s = balancer.run(opts(table, state_uri, T0, unreplicated=False), peered)
    assert s["moved"] == 2
    assert calls.count("update_item") == 2 and "query" in calls
    assert free_count(ddb, table, E) == 2


def test_refuses_to_move_a_region_it_has_no_replica_for(
    ddb: Any,
    table: str,
    state_uri: str,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run with one region's endpoint and no --peer-endpoint, a run over
    a global table would move eu-west-1's items in us-east-1's replica, racing eu-west-1's
    claims by last-writer-wins. It refuses instead, before writing any item: exit 1, a JSON
    summary naming the regions without an endpoint, the table's resource items untouched."""
    seed_pool(ddb, table, region=W, count=30)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    before = resource_items(ddb, table)
    argv = [
        "--table", table, "--region", E, "--regions", f"{E},{W}", "--endpoint-url",
        moto_endpoint, "--state-uri", state_uri, "--now", str(T0 // US),
    ]  # fmt: skip
    assert balancer.main(argv) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "refused" and summary["missing_peer_endpoints"] == [W]
    assert "--peer-endpoint" in summary["error"] and summary["moved"] == 0
    assert resource_items(ddb, table) == before
    # one plain table, said so: it runs (peer replicas: test_peer_endpoint_moves_in_the_...)
    assert balancer.main([*argv, "--unreplicated"]) == 0
    assert json.loads(capsys.readouterr().out)["moved"] == 2


def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Bad usage exits 2 with a message, before touching anything."""
    assert balancer.main(["--region", E, "--state-uri", "", "--now", "1"]) == 2
    assert "state" in capsys.readouterr().err
    assert balancer.main(["--region", E, "--state-uri", "file:///tmp/x"]) == 2
    assert balancer.main(["--region", E, "--dry-run", "--interval", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        balancer.main(["--regions", "Bad_Region"])
    assert exc.value.code == 2


def test_help_explains_flags_and_environment(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` names every flag and the environment it reads."""
    with pytest.raises(SystemExit) as exc:
        balancer.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for word in ("--regions", "--state-uri", "--interval", "--horizon", "--max-moves",
                 "--dry-run", "RASD_STATE_URI", "RASD_TABLE", "RASD_REGION"):  # fmt: skip
        assert word in text


def test_s3_errors_other_than_missing_state_are_failures(s3: Any, state_uri: str) -> None:
    """No state yet is normal (None); an S3 failure is not hidden as 'no state'."""
    loc = s3state.parse_uri(state_uri)
    assert s3state.load(s3, loc) == (None, None)
    with pytest.raises(ClientError):
        s3state.load(s3, s3state.Location("no-such-bucket-rasd", "x"))
