"""The offline jobs (rasadmin, ras-liberator, ras-dedupe) against moto's server over HTTP.

Jobs are called in-process through ``main(argv)`` (time passed in with the hidden ``--now``),
and the console scripts once each through a subprocess. Races are injected with a wrapper
around the real boto3 client that acts just before the job's write.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from rasd.config import Config
from rasd.core.builders import claim, extend_resource, free_claim
from rasd.core.decide import lease_from_item, pick, pick_mapping
from rasd.core.lease import FREE, LIVE, US, Mapping, ResourceItem, fmt_time, map_pk, partition_name
from rasd.core.map_builders import map_acquire, map_confirm, map_extend, map_release
from rasd.core.serialize import is_tombstone, item_from_ddb, mapping_from_ddb
from rasd.core.verdicts import Orphan, orphan_verdict
from rasd.core.writes import ItemKey, Write, key_av, render
from rasd_jobs import admin, common, dedupe, liberator
from rasd_jobs.admin import cli
from tests.helpers.tables import scan_all, seed_pool

pytestmark = pytest.mark.integration

NOW = 1_800_000_000 * US  # the jobs' "now" in every test
HOUR = 3600 * US
MINUTE = 60 * US
EAST, WEST = "us-east-1", "eu-west-1"
#: the daemons' default quarantine Q, which every job uses unless told otherwise
Q = int(Config().quarantine * US)
#: the daemons' default clock-skew bound
SKEW = int(Config().max_clock_skew * US)
OWNER = "test:0:0"  # the ``owner`` a test's "daemon" writes into mapping items


# ------------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def _one_table_for_all_regions(monkeypatch: pytest.MonkeyPatch) -> Any:
    """AWS_REGION pins every job's DynamoDB client to moto's us-east-1, so the one table
    stands in for the replicated global table whatever RAS region a job manages. The jobs
    configure structlog for a CLI process; the test session's setup is put back after."""
    monkeypatch.setenv("AWS_REGION", EAST)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def get(ddb: Any, table: str, resource: str, client: str = "demo") -> ResourceItem:
    raw = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": client}, "resource": {"S": resource}},
        ConsistentRead=True,
    )["Item"]
    return item_from_ddb(raw)


def put(ddb: Any, table: str, w: Write, **kw: Any) -> dict[str, Any]:
    """Send one ``rasd.core.writes.Write`` as the daemon does (rendered for UpdateItem)."""
    resp: dict[str, Any] = ddb.update_item(TableName=table, **render(w), **kw)
    return resp


def map_ident(key: str, region: str, client: str = "demo", pool: str = "default") -> ItemKey:
    return (map_pk(client, pool, key), region)


def get_map(ddb: Any, table: str, ident: ItemKey) -> Mapping | None:
    """A key's mapping item in one region, read as a daemon reads it (strongly consistent)."""
    raw = ddb.get_item(TableName=table, Key=key_av(ident), ConsistentRead=True).get("Item")
    return mapping_from_ddb(raw) if raw else None


def lease(
    ddb: Any,
    table: str,
    resource: str,
    key: str,
    expires_us: int,
    acquired_us: int | None = None,
    client: str = "demo",
    crash_before_mapping: bool = False,
    confirm: bool = True,
) -> ResourceItem:
    """Lease ``resource`` to ``key`` the way a daemon does: read the key's mapping item in
    the resource's region (consistent GetItem), ``map_acquire`` at its version with a new
    random token, ``claim`` with that token and ``mver = ver + 1``, then ``map_confirm``.

    Leasing one key twice in one region therefore leaves the earlier resource an orphan (held,
    but its mapping names the later acquisition), as a crash can. ``crash_before_mapping``:
    the daemon died after its claim landed and before its ``map_acquire`` did (that write may
    still be in flight): the resource is held at ``mver`` while the mapping is at ``mver - 1``
    (or absent when ``mver`` is 1). ``confirm=False``: the daemon served the lease and died
    before its background ``map_confirm``: the mapping stays pending (a lease all the same)."""
    item = get(ddb, table, resource, client)
    acquired = acquired_us if acquired_us is not None else min(expires_us, NOW) - HOUR
    ident = map_ident(key, item.region, client, item.pool_id)
    m = get_map(ddb, table, ident)
    ver = m.ver if m is not None else 0
    token = secrets.token_hex(8)
    if not crash_before_mapping:
        put(ddb, table, map_acquire(ident, ver, token, resource, item.version, expires_us,
                                    acquired, OWNER))  # fmt: skip
    w = claim(item, key, expires_us, acquired, token, ver + 1)
    got = item_from_ddb(put(ddb, table, w, ReturnValues="ALL_NEW")["Attributes"])
    if not crash_before_mapping and confirm:
        pending = get_map(ddb, table, ident)
        assert pending is not None and pending.token == token
        put(ddb, table, map_confirm(pending))
    return got


def daemon_extend(ddb: Any, table: str, resource: str, new_end: int) -> None:
    """A daemon extends the lease it serves: the resource first, then the mapping."""
    cur = lease_from_item(get(ddb, table, resource))
    put(ddb, table, extend_resource(cur, new_end))
    put(ddb, table, map_extend(cur, new_end))


def daemon_release(ddb: Any, table: str, resource: str, now_us: int = NOW) -> None:
    """A daemon releases the lease it serves: the mapping first (``map_release``), then the
    resource, claimable again only after the quarantine (``free_claim``)."""
    cur = lease_from_item(get(ddb, table, resource))
    assert cur.token is not None
    put(ddb, table, map_release(map_ident(cur.key, cur.region, cur.client_id, cur.pool_id),
                                cur.token, now_us))  # fmt: skip
    put(ddb, table, free_claim((cur.client_id, cur.resource), cur.key, cur.token, now_us,
                               now_us + Q))  # fmt: skip


def served(ddb: Any, table: str) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(client, pool, key) -> (region, resource) every daemon serves: among the key's
    mapping items that name a claim, the one ``pick_mapping`` chooses."""
    by_key: dict[tuple[str, str, str], list[Mapping]] = {}
    for raw in scan_all(ddb, table):
        if raw["client_id"]["S"].startswith("#map#"):
            m = mapping_from_ddb(raw)
            if m.state != FREE:
                by_key.setdefault((m.client_id, m.pool_id, m.key), []).append(m)
    out: dict[tuple[str, str, str], tuple[str, str]] = {}
    for k, ms in by_key.items():
        m = pick_mapping(ms)
        assert m is not None and m.resource is not None
        out[k] = (m.region, m.resource)
    return out


def by_resource(ddb: Any, table: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(it["client_id"]["S"], it["resource"]["S"]): it for it in scan_all(ddb, table)}


def leased_items(ddb: Any, table: str) -> list[ResourceItem]:
    return [
        item_from_ddb(it)
        for it in scan_all(ddb, table)
        if "key" in it and not it["client_id"]["S"].startswith("#")
    ]


def base(table: str, endpoint: str, region: str | None = EAST, now_us: int = NOW) -> list[str]:
    """Connection flags, the RAS region (omitted when None) and the jobs' ``--now``."""
    argv = ["--table", table, "--endpoint-url", endpoint, "--now", str(now_us / US)]
    return [*argv, "--region", region] if region is not None else argv


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    @property
    def summary(self) -> Any:
        return json.loads(self.out.strip().splitlines()[-1])

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out[-500:]!r}, err={self.err[-1500:]!r})"


def call(
    main: Callable[[Sequence[str]], int], argv: Sequence[str], capsys: pytest.CaptureFixture[str]
) -> Result:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return Result(code, out, err)


class Wrapped:
    """The real boto3 client, with a hook run just before chosen calls (fault injection)."""

    def __init__(self, real: Any, **hooks: Callable[[dict[str, Any]], None]) -> None:
        self._real = real
        self._hooks = hooks

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        hook = self._hooks.get(name)
        if hook is None:
            return attr

        def wrapper(**kw: Any) -> Any:
            hook(kw)
            return attr(**kw)

        return wrapper


# ------------------------------------------------------------------------------ liberator
def seed_leases(ddb: Any, table: str) -> dict[str, list[str]]:
    """20 east + 5 west items; leases: long expired, expired within the grace, running."""
    names = seed_pool(ddb, table, region=EAST, count=20)
    west = seed_pool(ddb, table, region=WEST, count=5, prefix="w-")
    groups = {
        "old": names[0:4],  # expired an hour ago: freed
        "grace": names[4:6],  # expired 10 s ago, inside the 60 s grace: kept
        "live": names[6:10],  # running: kept
        "west_old": west[0:2],  # expired, but another region's: kept
        "free": names[10:],
    }
    for i, r in enumerate(groups["old"]):
        lease(ddb, table, r, f"old-{i}", NOW - HOUR)
    for i, r in enumerate(groups["grace"]):
        lease(ddb, table, r, f"grace-{i}", NOW - 10 * US)
    for i, r in enumerate(groups["live"]):
        lease(ddb, table, r, f"live-{i}", NOW + HOUR)
    for i, r in enumerate(groups["west_old"]):
        lease(ddb, table, r, f"west-{i}", NOW - HOUR)
    return groups


def test_liberator_frees_only_expired_leases_of_its_region(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only leases past lease_expires + grace, of the job's own region, are freed; a freed
    item leaves leased_resources (key, lease_expires, holder, mver removed) and joins
    available_resources (lease_available = now: its end has passed, no quarantine) with its
    version incremented once. Real leases older than --orphan-age are checked against their
    mapping and left alone."""
    groups = seed_leases(ddb, table)
    before = by_resource(ddb, table)
    r = call(liberator.main, base(table, moto_endpoint), capsys)
    assert r.code == 0, r
    s = r.summary
    assert (s["expired"], s["freed"], s["lost_races"], s["errors"]) == (4, 4, 0, 0), s
    # New: the east "grace" and "live" leases were acquired an hour ago (> --orphan-age), so
    # each is checked against its key's mapping; every one is a real lease: none is freed.
    assert (s["orphans_checked"], s["orphans"], s["orphans_freed"]) == (6, 0, 0), s
    assert s["scanned"] >= 4 and s["seconds"] >= 0
    after = by_resource(ddb, table)
    for res in groups["old"]:
        old, new = item_from_ddb(before[("demo", res)]), item_from_ddb(after[("demo", res)])
        assert new.key is None and new.lease_expires_us is None
        assert new.lease_available == fmt_time(NOW)
        assert new.version == old.version + 1
        for attr in ("lease_acquired", "holder", "mver"):
            assert attr not in after[("demo", res)], (res, attr)
    untouched = groups["grace"] + groups["live"] + groups["west_old"] + groups["free"]
    for res in untouched:
        assert after[("demo", res)] == before[("demo", res)], res


def test_liberator_all_regions_and_dry_run(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run writes nothing; --all-regions also frees other regions' expired leases."""
    groups = seed_leases(ddb, table)
    before = by_resource(ddb, table)
    r = call(liberator.main, [*base(table, moto_endpoint), "--all-regions", "--dry-run"], capsys)
    assert r.code == 0, r
    assert (r.summary["expired"], r.summary["freed"], r.summary["would_free"]) == (6, 0, 6)
    assert by_resource(ddb, table) == before
    r = call(liberator.main, [*base(table, moto_endpoint), "--all-regions"], capsys)
    assert r.code == 0 and r.summary["freed"] == 6, r
    assert (r.summary["orphans"], r.summary["orphans_freed"]) == (0, 0), r
    for res in groups["west_old"]:
        assert get(ddb, table, res).key is None


def test_liberator_second_run_changes_nothing(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The liberator is idempotent: run again at the same time, it writes nothing."""
    seed_leases(ddb, table)
    argv = [*base(table, moto_endpoint), "--segments", "3", "--page-size", "3"]
    assert call(liberator.main, argv, capsys).summary["freed"] == 4
    snapshot = by_resource(ddb, table)
    r = call(liberator.main, argv, capsys)
    assert r.code == 0, r
    assert (r.summary["expired"], r.summary["freed"], r.summary["errors"]) == (0, 0, 0)
    assert (r.summary["orphans"], r.summary["orphans_freed"]) == (0, 0), r
    assert by_resource(ddb, table) == snapshot


def test_liberator_spares_a_lease_extended_between_read_and_write(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon that extends an expired-looking lease after the liberator read it wins: the
    liberator's write (conditional on version and lease_expires) fails, counts as a lost race,
    and the lease keeps its key, holder and new end, and its mapping still names it. The
    other expired leases are still freed."""
    groups = seed_leases(ddb, table)
    victim = groups["old"][1]
    new_end = NOW + 2 * HOUR

    def extend_first(kw: dict[str, Any]) -> None:
        if kw["Key"]["resource"]["S"] == victim:
            daemon_extend(ddb, table, victim, new_end)

    real_make = common.make_client
    monkeypatch.setattr(
        common,
        "make_client",
        lambda *a, **k: Wrapped(real_make(*a, **k), update_item=extend_first),
    )
    r = call(liberator.main, base(table, moto_endpoint), capsys)
    assert r.code == 0, r
    assert (r.summary["expired"], r.summary["freed"], r.summary["lost_races"]) == (4, 3, 1)
    kept = get(ddb, table, victim)
    assert kept.key == "old-1" and kept.lease_expires_us == new_end
    assert kept.lease_available is None
    m = get_map(ddb, table, map_ident("old-1", EAST))
    assert m is not None and (m.state, m.token, m.resource) == (LIVE, kept.holder, victim)
    assert m.expires_us == new_end
    for res in groups["old"]:
        if res != victim:
            assert get(ddb, table, res).key is None


def test_two_liberators_at_once_free_each_item_once(ddb: Any, table: str) -> None:
    """Two liberators that read the same expired leases and then write at the same time free
    each item exactly once: one write per item succeeds, the other is a lost race, and every
    freed item's version went up by exactly one. (A barrier makes both finish their Scan
    before either writes, so every item is contested.) A write one of whose attempts lost its
    answer (moto closes connections; a loaded machine) may not tell its own win from the
    other's: an unknown outcome, counted as an error, never as freed or lost."""
    names = seed_pool(ddb, table, region=EAST, count=30)
    claimed = {r: lease(ddb, table, r, f"k{i}", NOW - HOUR).version for i, r in enumerate(names)}
    barrier = threading.Barrier(2, timeout=60)
    first = [True, True]

    def wait_once(i: int) -> Callable[[dict[str, Any]], None]:
        def hook(kw: dict[str, Any]) -> None:
            if first[i]:
                first[i] = False
                barrier.wait()

        return hook

    results: list[dict[str, Any]] = [{}, {}]

    def one(i: int) -> None:
        opts = liberator.Options(table=table, region=EAST, now_us=NOW, segments=1)
        results[i] = liberator.run(Wrapped(ddb, update_item=wait_once(i)), opts)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    a, b = results
    assert a["expired"] == b["expired"] == 30, results
    freed, lost = a["freed"] + b["freed"], a["lost_races"] + b["lost_races"]
    unknown = a["errors"] + b["errors"]
    # every contested write is accounted for: a win is freed (or unknown), a loss lost (or
    # unknown), never a loss counted as freed
    assert freed + lost + unknown == 60 and freed <= 30 and lost <= 30, results
    for r, v in claimed.items():
        it = get(ddb, table, r)
        assert it.key is None and it.holder is None and it.version == v + 1, (r, it)


def test_liberator_frees_orphans_with_quarantine_and_keeps_the_lease(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A held resource whose key's mapping names another acquisition (an orphan a crash left)
    and that was acquired longer ago than --orphan-age is freed, unclaimable until its lease's
    end plus --grace (the mapping named it once: it may have been served until then, and no
    app need have released it; verdicts.orphan_free_at), at least --quarantine; the lease the
    mapping names is left alone, and so is a younger orphan (its acquisition may
    still be under way). --dry-run counts the orphan and writes nothing; a second run finds
    nothing to do."""
    seed_pool(ddb, table, region=EAST, count=10)
    lease(ddb, table, "res-00000", "k", NOW + HOUR, acquired_us=NOW - 10 * MINUTE)  # orphan
    lease(ddb, table, "res-00001", "k", NOW + HOUR, acquired_us=NOW - 5 * MINUTE)  # the lease
    lease(ddb, table, "res-00002", "j", NOW + HOUR, acquired_us=NOW - 60 * US)  # young orphan
    lease(ddb, table, "res-00003", "j", NOW + HOUR, acquired_us=NOW - 30 * US)
    quarantine = 45 * US
    liberator_grace = int(liberator.DEFAULT_GRACE_S * US)
    argv = [*base(table, moto_endpoint), "--orphan-age", "120", "--quarantine", "45"]
    argv.append("--no-legacy-agents")  # the quarantine alone (no paper agent on the table)
    before = by_resource(ddb, table)
    orphan = get(ddb, table, "res-00000")
    m = get_map(ddb, table, map_ident("k", EAST))
    assert m is not None and m.resource == "res-00001"
    assert orphan_verdict(orphan, m) is Orphan.ORPHAN  # the premise

    r = call(liberator.main, [*argv, "--dry-run"], capsys)
    assert r.code == 0, r
    s = r.summary
    assert (s["orphans_checked"], s["orphans"], s["orphans_freed"]) == (2, 1, 0), s
    assert by_resource(ddb, table) == before

    r = call(liberator.main, argv, capsys)
    assert r.code == 0, r
    s = r.summary
    assert (s["expired"], s["freed"], s["lost_races"], s["errors"]) == (0, 0, 0, 0), s
    assert (s["orphans_checked"], s["orphans"], s["orphans_freed"]) == (2, 1, 1), s
    after = by_resource(ddb, table)
    freed = item_from_ddb(after[("demo", "res-00000")])
    assert freed.key is None and freed.holder is None and freed.lease_expires_us is None
    assert orphan.lease_expires_us is not None
    assert freed.lease_available is None  # out of the available index until re-listed
    assert freed.quarantine_until == fmt_time(orphan.lease_expires_us + liberator_grace)
    assert freed.quarantine_until > fmt_time(NOW + quarantine)
    assert freed.version == orphan.version + 1
    for attr in ("lease_acquired", "holder", "mver"):
        assert attr not in after[("demo", "res-00000")], attr
    for k, it in before.items():
        if k != ("demo", "res-00000"):
            assert after[k] == it, k  # the lease, its mapping, the young orphan: untouched
    assert served(ddb, table)[("demo", "default", "k")] == (EAST, "res-00001")

    r = call(liberator.main, argv, capsys)
    assert r.code == 0, r
    s = r.summary
    assert (s["orphans_checked"], s["orphans"], s["orphans_freed"]) == (1, 0, 0), s
    assert by_resource(ddb, table) == after


@pytest.mark.parametrize("mapping", ["absent", "behind"])
def test_liberator_fences_a_mapping_whose_acquisition_may_still_land(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    mapping: str,
) -> None:
    """A daemon died after its claim landed and before its map_acquire did: the resource is
    held at ``mver`` while the mapping is at ``mver - 1`` (absent when ``mver`` is 1), and the
    mapping write may still be in flight (orphan_verdict FENCE_MAPPING). The liberator fences
    the mapping past ``mver - 1`` first, so that write can never apply, and then frees the
    orphan with quarantine (to its lease's end when the mapping is absent: it may have named
    it before a TTL reaped it). A lease the mapping already names (``behind``) is kept."""
    seed_pool(ddb, table, region=EAST, count=4)
    ident = map_ident("k", EAST)
    if mapping == "behind":
        lease(ddb, table, "res-00001", "k", NOW + HOUR, acquired_us=NOW - 20 * MINUTE)
    prior = get_map(ddb, table, ident)
    orphan = lease(ddb, table, "res-00000", "k", NOW + HOUR, acquired_us=NOW - 10 * MINUTE,
                   crash_before_mapping=True)  # fmt: skip
    assert orphan.mver == (prior.ver if prior else 0) + 1
    assert orphan_verdict(orphan, prior) is Orphan.FENCE_MAPPING  # the premise
    free_before = get(ddb, table, "res-00000")

    argv = [*base(table, moto_endpoint), "--quarantine", "57", "--no-legacy-agents"]
    r = call(liberator.main, argv, capsys)
    assert r.code == 0, r
    s = r.summary
    assert (s["orphans"], s["orphans_freed"], s["lost_races"], s["errors"]) == (1, 1, 0, 0), s
    assert s["orphans_checked"] == (2 if mapping == "behind" else 1), s

    m = get_map(ddb, table, ident)
    assert m is not None and m.ver == orphan.mver, m  # fenced: past what the write expects
    if prior is None:
        assert (m.state, m.token, m.resource) == (FREE, None, None), m
    else:  # only the version moved: the lease it names is untouched
        assert (m.state, m.token, m.resource, m.expires_us) == (
            prior.state, prior.token, prior.resource, prior.expires_us)  # fmt: skip
        assert get(ddb, table, "res-00001").holder == prior.token
    freed = get(ddb, table, "res-00000")
    assert freed.key is None and freed.holder is None
    # Behind: the mapping write never landed, so the claim was never served: the quarantine.
    # Absent: the mapping may have been reaped by TTL after naming it: held to its end.
    grace = int(liberator.DEFAULT_GRACE_S * US)
    hold = NOW + Q if mapping == "behind" else NOW + HOUR + grace
    assert freed.lease_available is None and freed.quarantine_until == fmt_time(hold)
    assert freed.version == free_before.version + 1
    # The dead daemon's map_acquire, landing now, is refused: no mapping ever names the claim.
    late = map_acquire(ident, orphan.mver - 1, orphan.holder or "", "res-00000",
                       orphan.version - 1, NOW + HOUR, NOW - 10 * MINUTE, OWNER)  # fmt: skip
    with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
        put(ddb, table, late)


def test_liberator_subprocess_console_script(ddb: Any, table: str, moto_endpoint: str) -> None:
    """The installed ``ras-liberator`` reads RASD_TABLE/RASD_REGION/AWS_ENDPOINT_URL_DYNAMODB,
    prints exactly one JSON line on stdout and logs JSON on stderr."""
    seed_leases(ddb, table)
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL_DYNAMODB": moto_endpoint,
        "RASD_TABLE": table,
        "RASD_REGION": EAST,
    }
    exe = Path(sys.executable).parent / "ras-liberator"
    p = subprocess.run(
        [str(exe), "--now", str(NOW / US)], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["freed"] == 4 and summary["table"] == table and summary["region"] == EAST
    for line in p.stderr.strip().splitlines():
        json.loads(line)  # every log line is JSON

    admin_exe = Path(sys.executable).parent / "rasadmin"
    p = subprocess.run(
        [str(admin_exe), "stats", "--json", "--now", str(NOW / US)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    rows = {(r["pool_id"], r["region"]): r for r in json.loads(p.stdout)}
    assert rows[("default", EAST)]["free"] == 14  # 10 never leased + 4 just freed


def test_job_exits_1_when_table_is_missing(
    moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken dependency (no such table) is a job error: exit 1, summary counts it."""
    r = call(liberator.main, base("no-such-table", moto_endpoint), capsys)
    assert r.code == 1, r
    assert r.summary["errors"] >= 1


# --------------------------------------------------------------------------------- dedupe
def seed_duplicates(ddb: Any, table: str) -> None:
    """Keys that got several resources, as cross-region races (and same-region crashes)
    leave them. ``lease`` leases the way a daemon does, so leasing one key twice in a region
    leaves the earlier resource an orphan: the key's mapping names only the last one."""
    seed_pool(ddb, table, region=EAST, count=20, prefix="e-")
    seed_pool(ddb, table, region=WEST, count=10, prefix="w-")
    seed_pool(ddb, table, pool_id="other", region=EAST, count=5, prefix="o-")
    end = NOW + HOUR
    longer = end + 60 * US  # every survivor outlasts its extras (ras-dedupe requires it)
    # k1: three east items, leased in this order; the mapping names the last one (e-00003),
    # e-00001 and e-00002 are orphans, although e-00002 has the earliest lease_acquired
    lease(ddb, table, "e-00001", "k1", end, acquired_us=NOW - 50 * US)
    lease(ddb, table, "e-00002", "k1", end, acquired_us=NOW - 90 * US)
    lease(ddb, table, "e-00003", "k1", end, acquired_us=NOW - 70 * US)
    # k2: the west claim is earlier: the east extra is released here
    lease(ddb, table, "e-00004", "k2", end, acquired_us=NOW - 10 * US)
    lease(ddb, table, "w-00001", "k2", longer, acquired_us=NOW - 20 * US)
    # k3: east is earlier: the west extra is only reported by the east job
    lease(ddb, table, "e-00005", "k3", longer, acquired_us=NOW - 30 * US)
    lease(ddb, table, "w-00002", "k3", end, acquired_us=NOW - 5 * US)
    # k4: same claim time in both regions: region order decides (eu-west-1 < us-east-1)
    lease(ddb, table, "e-00006", "k4", end, acquired_us=NOW - 40 * US)
    lease(ddb, table, "w-00003", "k4", longer, acquired_us=NOW - 40 * US)
    # not duplicates: one item per key, and one key in two different pools
    lease(ddb, table, "e-00007", "solo", end)
    lease(ddb, table, "e-00008", "k5", end)
    lease(ddb, table, "o-00000", "k5", end)


def holders(ddb: Any, table: str) -> dict[tuple[str, str, str], list[ResourceItem]]:
    """Every held resource item by (client, pool, key): leases and orphans alike."""
    out: dict[tuple[str, str, str], list[ResourceItem]] = {}
    for it in leased_items(ddb, table):
        assert it.key is not None
        out.setdefault((it.client_id, it.pool_id, it.key), []).append(it)
    return out


K1, K2, K3, K4 = (("demo", "default", k) for k in ("k1", "k2", "k3", "k4"))


#: an extra that ras-dedupe releases is claimable no earlier than its lease end plus the skew
EXTRA_FREE = NOW + HOUR + int(Config().max_clock_skew * US)


def assert_released(
    ddb: Any, table: str, resource: str, key: str, region: str, until_us: int = NOW + Q
) -> None:
    """``resource`` was given back early, the way a daemon releases: its key's mapping in
    its region no longer names it, and it is claimable only after ``until_us`` (the
    quarantine; for an extra ras-dedupe released, its own lease end)."""
    it = get(ddb, table, resource)
    assert it.key is None and it.holder is None, it
    assert it.quarantine_until == fmt_time(until_us), it
    m = get_map(ddb, table, map_ident(key, region))
    assert m is None or m.resource != resource, m


def test_dedupe_keeps_exactly_one_resource_per_key(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """After each region's dedupe ran, every (client, pool, key) holds exactly one resource:
    the one the daemons serve (its region's mapping names it, and among regions it is the
    one ``pick()`` chooses). Within a region, only the item the mapping names is a lease:
    the others are orphans, freed with quarantine and held to their lease end (the mapping
    named them once), even when their claim is earlier. Each
    job released only its own region's extras (mapping first, then the resource, with
    quarantine) and reported the others."""
    seed_duplicates(ddb, table)
    chosen = served(ddb, table)
    assert chosen[K1] == (EAST, "e-00003")  # what the mapping names ...
    assert pick(holders(ddb, table)[K1]).resource == "e-00002"  # type: ignore[union-attr]
    # ... not the earliest claim: that one is an orphan no daemon serves
    assert chosen[K2] == (WEST, "w-00001")
    assert chosen[K4] == (WEST, "w-00003")

    r = call(dedupe.main, base(table, moto_endpoint, EAST), capsys)
    assert r.code == 0, r
    s = r.summary
    # Changed: the old protocol released k1's two east extras as leases (released 4). Now
    # they are orphans (the mapping names e-00003), counted in orphans_freed; only k2's and
    # k4's east extras are released leases.
    assert (s["duplicate_keys"], s["released"], s["orphans_freed"]) == (4, 2, 2), s
    assert (s["foreign_reported"], s["lost_races"], s["errors"]) == (1, 0, 0), s
    assert "foreign_duplicate" in r.err and "w-00002" in r.err
    # the west extra of k3 is still there: only the west job may release it
    assert len(holders(ddb, table)[K3]) == 2

    r = call(dedupe.main, base(table, moto_endpoint, WEST), capsys)
    assert r.code == 0, r
    s = r.summary
    assert (s["duplicate_keys"], s["released"], s["orphans_freed"]) == (1, 1, 0), s
    assert s["foreign_reported"] == 0

    after = holders(ddb, table)
    assert set(after) == set(chosen)
    for k, items in after.items():
        assert len(items) == 1, (k, items)
        assert (items[0].region, items[0].resource) == chosen[k], k
    assert served(ddb, table) == chosen  # the daemons' answers did not change
    # Changed: an early free is claimable only after the quarantine (was: at once).
    # Orphans the mapping named once (it moved past them): held to their lease end too, as
    # apps may use them until then (verdicts.orphan_free_at).
    assert_released(ddb, table, "e-00001", "k1", EAST, EXTRA_FREE)
    assert_released(ddb, table, "e-00002", "k1", EAST, EXTRA_FREE)
    assert_released(ddb, table, "e-00004", "k2", EAST, EXTRA_FREE)  # released extras
    assert_released(ddb, table, "e-00006", "k4", EAST, EXTRA_FREE)
    assert_released(ddb, table, "w-00002", "k3", WEST, EXTRA_FREE)
    for key in ("k2", "k4"):  # their east mappings were released: state free
        m = get_map(ddb, table, map_ident(key, EAST))
        assert m is not None and (m.state, m.token) == (FREE, None), m


def test_dedupe_ignores_lapsed_leases(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An expired (not yet liberated) earlier claim does not win over the live lease the
    daemons serve: dedupe groups live leases only and leaves lapsed ones to the liberator.
    (Across regions: within one region the mapping alone would decide.)"""
    seed_pool(ddb, table, region=EAST, count=4, prefix="e-")
    seed_pool(ddb, table, region=WEST, count=4, prefix="w-")
    lease(ddb, table, "w-00000", "kx", NOW - US, acquired_us=NOW - 2 * HOUR)  # lapsed
    lease(ddb, table, "e-00001", "kx", NOW + HOUR, acquired_us=NOW - 60 * US)  # live
    before = by_resource(ddb, table)
    for region in (EAST, WEST):
        argv = [*base(table, moto_endpoint, region), "--peer-endpoint",
                f"{WEST if region == EAST else EAST}={moto_endpoint}"]  # fmt: skip
        r = call(dedupe.main, argv, capsys)
        assert r.code == 0, r
        s = r.summary
        assert (s["duplicate_keys"], s["released"], s["orphans_freed"]) == (0, 0, 0), s
    assert by_resource(ddb, table) == before
    assert get(ddb, table, "e-00001").key == "kx"


def test_dedupe_second_run_changes_nothing(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run again, dedupe finds only the (reported) foreign duplicate and writes nothing."""
    seed_duplicates(ddb, table)
    s = call(dedupe.main, base(table, moto_endpoint), capsys).summary
    assert (s["released"], s["orphans_freed"]) == (2, 2), s  # was released 4: see above
    snapshot = by_resource(ddb, table)
    r = call(dedupe.main, [*base(table, moto_endpoint), "--segments", "2"], capsys)
    assert r.code == 0, r
    s = r.summary
    assert (s["released"], s["orphans_freed"], s["foreign_reported"]) == (0, 0, 1), r
    assert by_resource(ddb, table) == snapshot


def test_dedupe_dry_run_and_peer_endpoint(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run writes nothing; --peer-endpoint REGION=URL releases that region's extras
    through its endpoint instead of reporting them (one table stands in for both here)."""
    seed_duplicates(ddb, table)
    snapshot = by_resource(ddb, table)
    r = call(dedupe.main, [*base(table, moto_endpoint), "--dry-run"], capsys)
    # would_release counts orphans and extras alike (2 + 2)
    assert r.code == 0 and r.summary["would_release"] == 4 and r.summary["released"] == 0, r
    assert r.summary["orphans_freed"] == 0, r
    assert by_resource(ddb, table) == snapshot
    argv = [*base(table, moto_endpoint), "--peer-endpoint", f"{WEST}={moto_endpoint}"]
    r = call(dedupe.main, argv, capsys)
    assert r.code == 0, r
    # Changed: was released 5; k1's two in-region extras are now orphans (orphans_freed).
    s = r.summary
    assert (s["released"], s["orphans_freed"], s["foreign_reported"]) == (3, 2, 0), r
    assert all(len(v) == 1 for v in holders(ddb, table).values())
    assert_released(ddb, table, "w-00002", "k3", WEST, EXTRA_FREE)  # through the peer endpoint


def test_dedupe_leaves_the_key_its_lease_when_survivor_changed(ddb: Any, table: str) -> None:
    """If the survivor lost its key after the scan (released, liberated), releasing the
    extras would leave the key with nothing it was using. The group is decided again on
    consistent reads: the released survivor is no longer a lease, so the extra is now the
    only lease of the key, and it is kept."""
    seed_duplicates(ddb, table)
    once = [True]

    def release_survivor(kw: dict[str, Any]) -> None:
        if kw["Key"]["resource"]["S"] == "w-00001" and once[0]:  # k2's survivor
            once[0] = False
            daemon_release(ddb, table, "w-00001")

    opts = dedupe.Options(table=table, region=EAST, now_us=NOW, segments=2)
    s = dedupe.run(Wrapped(ddb, get_item=release_survivor), opts)
    assert not once[0], "the hook never ran"
    # Changed: the old job skipped the group as a lost race; the new one re-reads every item
    # of the group consistently before deciding, so k2 simply has one lease left: no race.
    assert (s["released"], s["orphans_freed"], s["lost_races"], s["errors"]) == (1, 2, 0, 0), s
    assert [it.resource for it in holders(ddb, table)[K2]] == ["e-00004"]
    assert served(ddb, table)[K2] == (EAST, "e-00004")


def test_dedupe_extra_reacquired_between_read_and_write_is_a_lost_race(
    ddb: Any, table: str
) -> None:
    """An extra that a daemon released after dedupe read it, its key then acquiring another
    resource in that region, is not touched: dedupe's mapping release is conditional on the
    token it read, fails, and counts as a lost race; the new lease and its mapping stay."""
    seed_duplicates(ddb, table)
    k2_east = map_ident("k2", EAST)
    once = [True]

    def reacquire_first(kw: dict[str, Any]) -> None:
        key = (kw["Key"]["client_id"]["S"], kw["Key"]["resource"]["S"])
        if key == k2_east and once[0]:
            once[0] = False
            daemon_release(ddb, table, "e-00004")
            lease(ddb, table, "e-00010", "k2", NOW + HOUR, acquired_us=NOW)

    opts = dedupe.Options(table=table, region=EAST, now_us=NOW)
    s = dedupe.run(Wrapped(ddb, update_item=reacquire_first), opts)
    assert not once[0], "the hook never ran"
    assert (s["released"], s["orphans_freed"], s["lost_races"], s["errors"]) == (1, 2, 1, 0), s
    new = get(ddb, table, "e-00010")
    assert new.key == "k2" and new.holder is not None
    m = get_map(ddb, table, k2_east)
    assert m is not None and (m.state, m.token, m.resource) == (LIVE, new.holder, "e-00010")
    assert_released(ddb, table, "e-00004", "k2", EAST)  # by the daemon, not by dedupe


def test_dedupe_extension_racing_the_release_cannot_keep_the_extra(ddb: Any, table: str) -> None:
    """A daemon still serving an extra from its cache may extend it while dedupe releases it.
    The release is conditional on the holder token (as a daemon's is), not on the version,
    so it goes through; the daemon's mapping extension is then refused (the mapping is
    already free), so no daemon serves the extra again, and it is claimable only after the
    quarantine. (The old protocol counted this as a lost race and kept the extra.)"""
    seed_duplicates(ddb, table)
    once = [True]

    def extend_first(kw: dict[str, Any]) -> None:
        if kw["Key"]["resource"]["S"] == "e-00004" and once[0]:  # dedupe frees the resource
            once[0] = False
            cur = lease_from_item(get(ddb, table, "e-00004"))
            put(ddb, table, extend_resource(cur, NOW + 2 * HOUR))  # R first: applies
            with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
                put(ddb, table, map_extend(cur, NOW + 2 * HOUR))  # then M: refused

    opts = dedupe.Options(table=table, region=EAST, now_us=NOW)
    s = dedupe.run(Wrapped(ddb, update_item=extend_first), opts)
    assert not once[0], "the hook never ran"
    assert (s["released"], s["orphans_freed"], s["lost_races"], s["errors"]) == (2, 2, 0, 0), s
    # held to the end apps were given (1 h): the daemon's 2 h never reached the mapping
    assert_released(ddb, table, "e-00004", "k2", EAST, EXTRA_FREE)
    assert served(ddb, table)[K2] == (WEST, "w-00001")


# -------------------------------------------------------------------------------- rasadmin
def test_rasadmin_pool_and_resource_lifecycle(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The admin commands do what the operations guide says, end to end: define, add (never
    overwriting an existing name), list with filters, show, stats, release (own region
    only, held to the lease's end), and delete only what is not leased (own region only)."""
    b = base(table, moto_endpoint, region=None)  # read-only commands: every region
    r = call(admin.main, ["create-table", *b], capsys)
    assert r.code == 0 and r.summary["created"] is False, r  # the fixture made it: idempotent
    r = call(admin.main, ["add-pool", *b, "--client", "acme", "--pool", "ads"], capsys)
    assert r.code == 0 and r.summary["max_lease"] == cli.DEFAULT_MAX_LEASE_S, r

    r = call(admin.main, ["add-resources", *b, "--client", "acme", "--pool", "ads",
                          "--count", "30", "--region", EAST], capsys)  # fmt: skip
    assert r.code == 0 and r.summary["added"] == 30, r
    r = call(admin.main, ["add-resources", *b, "--client", "acme", "--pool", "ads",
                          "--count", "5", "--prefix", "ads-", "--region", EAST],
             capsys)  # fmt: skip
    assert r.summary["added"] == 5, r  # numbering continues after the existing names
    monkeypatch.setattr(sys, "stdin", io.StringIO("ads-000000\n\nx1\nx2\nx1\n"))
    r = call(admin.main, ["add-resources", *b, "--client", "acme", "--pool", "ads",
                          "--file", "-", "--region", WEST], capsys)  # fmt: skip
    assert (r.summary["added"], r.summary["skipped_existing"]) == (2, 2), r

    items = [item_from_ddb(it) for it in scan_all(ddb, table) if it["client_id"]["S"] == "acme"]
    assert len(items) == 37
    assert len({it.resource for it in items}) == 37
    east = [it for it in items if it.region == EAST]
    assert {it.partition for it in east} == {
        partition_name("acme", "ads", EAST, n) for n in range(10)
    }  # spread over all ten sub-partitions
    assert all(it.lease_available == fmt_time(NOW) and it.version == 0 for it in items)

    # claimed at NOW: add-resources made them claimable from NOW (claims check that now)
    lease(ddb, table, "ads-000001", "live", NOW + HOUR, acquired_us=NOW, client="acme")
    lease(ddb, table, "ads-000002", "dead", NOW - HOUR, acquired_us=NOW, client="acme")
    lease(ddb, table, "x1", "west", NOW + HOUR, acquired_us=NOW, client="acme")

    r = call(admin.main, ["list-pools", *b, "--json"], capsys)
    assert {(p["client_id"], p["pool_id"]) for p in json.loads(r.out)} == {("acme", "ads")}
    r = call(admin.main, ["show-pool", *b, "--client", "acme", "--pool", "ads", "--json"], capsys)
    regions = {x["region"]: x for x in json.loads(r.out)["regions"]}
    assert (regions[EAST]["free"], regions[EAST]["leased"], regions[EAST]["expired"]) == (33, 1, 1)
    assert (regions[WEST]["free"], regions[WEST]["leased"]) == (1, 1)

    def listing(*flags: str) -> set[str]:
        r = call(admin.main, ["list-resources", *b, "--client", "acme", "--json", *flags], capsys)
        assert r.code == 0, r
        return {row["resource"] for row in json.loads(r.out)}

    assert listing("--leased") == {"ads-000001", "x1"}
    assert listing("--expired") == {"ads-000002"}
    assert listing("--leased", "--region", WEST) == {"x1"}
    assert len(listing("--free")) == 34
    r = call(admin.main, ["list-resources", *b, "--client", "acme", "--leased"], capsys)
    assert r.out.splitlines()[0].split()[:3] == ["POOL_ID", "RESOURCE", "REGION"]

    r = call(admin.main, ["stats", *b, "--json"], capsys)
    stats = {(x["pool_id"], x["region"]): x for x in json.loads(r.out)}
    assert stats[("ads", EAST)] == {
        "client_id": "acme", "pool_id": "ads", "region": EAST,
        "free": 33, "claimable": 33, "quarantined": 0, "leased": 1, "expired": 1, "total": 35,
    }  # fmt: skip
    r = call(admin.main, ["show-resource", *b, "--client", "acme", "--resource", "x1", "--json"],
             capsys)  # fmt: skip
    assert json.loads(r.out)["key"] == "west"

    # release-resource: only items of --region; the release procedure, held to the lease's
    # end plus the skew (no app released it)
    rel = ["release-resource", *b, "--region", EAST, "--client", "acme", "--resource"]
    r = call(admin.main, [*rel, "x1"], capsys)
    assert r.code == 1 and "belongs to region eu-west-1" in r.err, r
    assert get(ddb, table, "x1", "acme").key == "west"
    r = call(admin.main, [*rel, "ads-000001"], capsys)
    assert r.code == 0 and r.summary["released"] is True, r
    assert r.summary["claimable_from"] == fmt_time(NOW + HOUR + SKEW), r
    released = get(ddb, table, "ads-000001", "acme")
    assert released.key is None and released.quarantine_until == fmt_time(NOW + HOUR + SKEW)

    # delete-resource: only items of --region; refuses a running lease without --force
    dele = ["delete-resource", *b, "--client", "acme", "--resource"]
    r = call(admin.main, [*dele, "x1", "--region", EAST, "--force"], capsys)
    assert r.code == 1 and "belongs to region eu-west-1" in r.err, r
    r = call(admin.main, [*dele, "x1", "--region", WEST], capsys)
    assert r.code == 1 and "refusing" in r.err, r
    assert call(admin.main, [*dele, "ads-000003", "--region", EAST], capsys).code == 0
    assert call(admin.main, [*dele, "x1", "--region", WEST, "--force"], capsys).code == 0
    assert call(admin.main, [*dele, "x1", "--region", WEST], capsys).code == 1  # gone


def test_rasadmin_release_resource_releases_mapping_then_resource(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rasadmin release-resource`` releases the way a daemon does: the key's mapping first
    (a daemon reading it then finds the key holds nothing in the region: ``free``), then the
    resource, claimable again only after --quarantine and after the lease's end plus the
    skew (no app released it: apps may use it until then). It answers "not leased" for a free
    item, and refuses (exit 1, no write) an item leased without a holder token (rasd 0.1)."""
    seed_pool(ddb, table, region=EAST, count=4)
    held = lease(ddb, table, "res-00001", "k", NOW + HOUR)
    before_map = get_map(ddb, table, map_ident("k", EAST))
    assert before_map is not None and before_map.state == LIVE
    writes: list[tuple[str, str]] = []

    def record(kw: dict[str, Any]) -> None:
        writes.append((kw["Key"]["client_id"]["S"], kw["Key"]["resource"]["S"]))

    real_make = common.make_client
    monkeypatch.setattr(
        common, "make_client", lambda *a, **k: Wrapped(real_make(*a, **k), update_item=record)
    )
    rel = ["release-resource", *base(table, moto_endpoint), "--client", "demo", "--resource"]
    r = call(admin.main, [*rel, "res-00001", "--quarantine", "30"], capsys)
    assert r.code == 0, r
    assert r.summary["released"] is True and r.summary["key"] == "k", r
    assert r.summary["claimable_from"] == fmt_time(NOW + HOUR + SKEW), r
    assert writes == [map_ident("k", EAST), ("demo", "res-00001")]  # mapping, then resource

    m = get_map(ddb, table, map_ident("k", EAST))  # what a daemon reads
    assert m is not None and (m.state, m.token, m.resource) == (FREE, None, None), m
    assert m.ver == before_map.ver + 1
    it = get(ddb, table, "res-00001")
    assert it.key is None and it.holder is None and it.lease_expires_us is None
    assert it.quarantine_until == fmt_time(NOW + HOUR + SKEW)
    assert it.version == held.version + 1

    writes.clear()
    r = call(admin.main, [*rel, "res-00001"], capsys)
    assert r.code == 0 and r.summary["released"] is False, r
    assert r.summary["reason"] == "not leased" and writes == [], r

    # A 0.1 lease: held, but no holder token and no mapping item.
    ddb.update_item(
        TableName=table,
        Key=key_av(("demo", "res-00002")),
        UpdateExpression="SET #k = :k, lease_expires = :e REMOVE lease_available",
        ExpressionAttributeNames={"#k": "key"},
        ExpressionAttributeValues={":k": {"S": "old"}, ":e": {"S": fmt_time(NOW + HOUR)}},
    )
    before = by_resource(ddb, table)
    r = call(admin.main, [*rel, "res-00002"], capsys)
    assert r.code == 1 and "older rasd" in r.err, r
    assert writes == [] and by_resource(ddb, table) == before


def test_delete_pool_refuses_while_leases_are_held(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pool with a running lease is not deleted without --force (nothing changes); with
    --force its definition and all its items go (each leaves a tombstone holding its name,
    in neither index), and other pools are untouched."""
    seed_pool(ddb, table, count=10)
    seed_pool(ddb, table, pool_id="keep", count=3, prefix="k-")
    lease(ddb, table, "res-00003", "live", NOW + HOUR)
    before = by_resource(ddb, table)
    argv = ["delete-pool", *base(table, moto_endpoint), "--client", "demo", "--pool", "default"]
    r = call(admin.main, argv, capsys)
    assert r.code == 1 and "refusing" in r.err and "--force" in r.err, r
    assert by_resource(ddb, table) == before

    r = call(admin.main, [*argv, "--force"], capsys)
    assert r.code == 0 and r.summary["deleted"] == 10, r
    left = by_resource(ddb, table)
    assert ("#meta", "pool#demo#default") not in left
    assert not [k for k, it in left.items() if it.get("pool_id", {}).get("S") == "default"]
    assert ("#meta", "pool#demo#keep") in left and len(left) == len(before) - 1
    tombs = {k for k, it in left.items() if is_tombstone(it)}
    assert tombs == {("demo", f"res-{i:05d}") for i in range(10)}
    for k in tombs:
        assert not {"key", "partition", "lease_available"} & set(left[k]), left[k]
    # the running lease's name is held to its end plus the skew; the free ones' to now
    assert left[("demo", "res-00003")]["hold_until"]["S"] == fmt_time(NOW + HOUR + SKEW)
    assert left[("demo", "res-00000")]["hold_until"]["S"] == fmt_time(NOW)


def test_delete_pool_with_only_expired_leases_needs_no_force(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Expired, not yet liberated leases are not held: the pool can be deleted, definition
    and every resource item. The lapsed lease's mapping is ended first (mapping before
    resource, on the way out), and DynamoDB's TTL reaps the mapping item later."""
    seed_pool(ddb, table, count=4)
    lease(ddb, table, "res-00000", "dead", NOW - HOUR)
    argv = ["delete-pool", *base(table, moto_endpoint), "--client", "demo", "--pool", "default"]
    r = call(admin.main, argv, capsys)
    assert r.code == 0 and r.summary["deleted"] == 4, r
    left = by_resource(ddb, table)
    assert [k for k, it in left.items() if not is_tombstone(it)] == [map_ident("dead", EAST)]
    assert len(left) == 5  # the mapping and four tombstones
    m = get_map(ddb, table, map_ident("dead", EAST))
    assert m is not None and m.state == "free" and m.resource is None, m


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["add-pool", "--client", "bad.name", "--pool", "p"], "bad client"),
        (["add-pool", "--client", "c", "--pool", "#meta"], "bad pool"),
        (["add-pool", "--client", "c", "--pool", "p", "--max-lease", "0"], "--max-lease"),
        (["add-resources", "--client", "demo", "--pool", "default", "--count", "0"], "--count"),
        (["add-resources", "--client", "demo", "--pool", "default"], "--count"),
        (["list-resources", "--client", "demo", "--region", "US_EAST"], "bad region"),
        (["show-resource", "--client", "a b", "--resource", "r"], "bad client"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_rasadmin_bad_input_exits_2(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """Bad flags or names stop before any write with a clear message on stderr and exit 2."""
    seed_pool(ddb, table, count=2)
    before = by_resource(ddb, table)
    full = argv if argv == ["frobnicate"] else [argv[0], *base(table, moto_endpoint), *argv[1:]]
    r = call(admin.main, full, capsys)
    assert r.code == 2, r
    assert message in r.err, r
    assert by_resource(ddb, table) == before


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        (liberator.main, ["--segments", "0"], "--segments"),
        (liberator.main, ["--grace", "-1"], "--grace"),
        (liberator.main, ["--region", "Not A Region"], "bad region"),
        (liberator.main, ["--now", "yesterday"], "--now"),
        (dedupe.main, ["--peer-endpoint", "eu-west-1"], "REGION=URL"),
        (dedupe.main, ["--peer-endpoint", "us-east-1=http://x:1"], "own region"),
    ],
)
def test_jobs_bad_input_exits_2(
    table: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
    main: Callable[[Sequence[str]], int],
    argv: list[str],
    message: str,
) -> None:
    """The jobs reject bad flags with a message naming the flag and exit 2."""
    r = call(main, [*base(table, moto_endpoint), *argv], capsys)
    assert r.code == 2, r
    assert message in r.err, r


def test_rasadmin_dry_runs_write_nothing(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run of add-resources and delete-pool reports what it would do and writes
    nothing; stats lists a defined pool that has no resources yet (region '-')."""
    seed_pool(ddb, table, count=5)
    b = base(table, moto_endpoint)
    before = by_resource(ddb, table)
    argv = ["add-resources", *b, "--client", "demo", "--pool", "default", "--count", "7",
            "--dry-run"]  # fmt: skip
    r = call(admin.main, argv, capsys)
    assert (r.code, r.summary["added"], r.summary["would_add"]) == (0, 0, 7), r
    argv = ["delete-pool", *b, "--client", "demo", "--pool", "default", "--dry-run"]
    r = call(admin.main, argv, capsys)
    assert (r.code, r.summary["resources"], r.summary["deleted"]) == (0, 5, 0), r
    assert by_resource(ddb, table) == before

    assert (
        call(admin.main, ["add-pool", *b, "--client", "demo", "--pool", "empty"], capsys).code == 0
    )
    r = call(admin.main, ["stats", *base(table, moto_endpoint, region=None), "--json"], capsys)
    rows = {(x["pool_id"], x["region"]): x["total"] for x in json.loads(r.out)}
    assert rows == {("default", EAST): 5, ("empty", "-"): 0}


def test_force_delete_ends_the_mapping_before_the_item(
    ddb: Any, table: str, moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting a leased item with --force ends its key's mapping first: otherwise daemons
    would keep serving a lease on a resource that is gone, and, were the name added again,
    hand it to a second key while the first is still served (I1)."""
    seed_pool(ddb, table, count=2)
    lease(ddb, table, "res-00000", "k", NOW + HOUR)
    b = base(table, moto_endpoint)
    argv = ["delete-resource", *b, "--client", "demo", "--resource", "res-00000"]
    assert call(admin.main, argv, capsys).code != 0  # leased: refused without --force
    m = get_map(ddb, table, map_ident("k", EAST))
    assert m is not None and m.state == "live"
    assert call(admin.main, [*argv, "--force"], capsys).code == 0
    m = get_map(ddb, table, map_ident("k", EAST))
    assert m is not None and m.state == "free" and m.resource is None, m
    tomb = by_resource(ddb, table)[("demo", "res-00000")]
    assert is_tombstone(tomb) and "key" not in tomb, tomb
    assert tomb["hold_until"]["S"] == fmt_time(NOW + HOUR + SKEW)  # the lease's end + skew


def test_dedupe_keeps_an_extra_its_survivor_does_not_outlast(ddb: Any, table: str) -> None:
    """Found by the chaos run: the survivor (the earliest claim) may end long before the
    extra. Releasing the extra then leaves its region with no servable lease while apps still
    use the extra, and the region acquires a third resource for the key (an in-region split,
    as apps see it). Such an extra is kept (its lease ends, or is liberated, by itself)."""
    seed_pool(ddb, table, region=EAST, count=2, prefix="e-")
    seed_pool(ddb, table, region=WEST, count=2, prefix="w-")
    lease(ddb, table, "w-00000", "k", NOW + 3 * US, acquired_us=NOW - 20 * US)  # ends first
    lease(ddb, table, "e-00000", "k", NOW + HOUR, acquired_us=NOW - 10 * US)
    opts = dedupe.Options(table=table, region=EAST, now_us=NOW, peers={WEST: ddb})
    s = dedupe.run(ddb, opts)
    assert (s["duplicate_keys"], s["released"], s["kept_until_survivor_outlasts"]) == (1, 0, 1)
    assert get(ddb, table, "e-00000").key == "k"


def test_dedupe_extension_after_its_check_makes_the_release_a_lost_race(
    ddb: Any, table: str
) -> None:
    """Found by chaos runs (an in-region split, then the same with a lost lease): a daemon
    extends the extra (resource, then mapping) after dedupe checked that the survivor
    outlasts it, and answers apps with the later end. Releasing the mapping regardless would
    leave the extra's region serving the survivor, which ends first: after its end the region
    would acquire another resource for the key while apps still use the extra (I2); holding
    the extra's resource to the later end keeps I1 but not I2. The mapping's release is
    conditional on the version whose end was checked: it loses the race, and the key keeps
    the extended lease in that region."""
    seed_duplicates(ddb, table)
    k2_east = map_ident("k2", EAST)
    once = [True]

    def extend_before_release(kw: dict[str, Any]) -> None:
        key = (kw["Key"]["client_id"]["S"], kw["Key"]["resource"]["S"])
        if key == k2_east and once[0]:  # dedupe is about to release k2's east mapping
            once[0] = False
            daemon_extend(ddb, table, "e-00004", NOW + 2 * HOUR)

    opts = dedupe.Options(table=table, region=EAST, now_us=NOW)
    s = dedupe.run(Wrapped(ddb, update_item=extend_before_release), opts)
    assert not once[0], "the hook never ran"
    assert (s["lost_races"], s["errors"]) == (1, 0), s
    r = get(ddb, table, "e-00004")
    assert r.key == "k2" and r.holder is not None, r
    m = get_map(ddb, table, k2_east)
    assert m is not None and (m.state, m.token, m.resource) == (LIVE, r.holder, "e-00004"), m
    assert m.expires_us == NOW + 2 * HOUR, m
    # the next run sees the later end, which the survivor does not outlast: kept
    s2 = dedupe.run(ddb, opts)
    assert (s2["released"], s2["kept_until_survivor_outlasts"]) == (0, 1), s2
    assert get(ddb, table, "e-00004").key == "k2"


def test_dedupe_keeps_an_extra_whose_survivor_is_still_pending(ddb: Any, table: str) -> None:
    """A survivor whose mapping is still pending (its daemon died before confirming it) is a
    lease, but other regions' daemons do not serve a pending mapping: releasing the extra
    would make its region acquire another resource while apps still use the extra (I2)."""
    seed_pool(ddb, table, region=EAST, count=2, prefix="e-")
    seed_pool(ddb, table, region=WEST, count=2, prefix="w-")
    lease(ddb, table, "w-00000", "k", NOW + 2 * HOUR, acquired_us=NOW - 20 * US, confirm=False)
    lease(ddb, table, "e-00000", "k", NOW + HOUR, acquired_us=NOW - 10 * US)
    opts = dedupe.Options(table=table, region=EAST, now_us=NOW, peers={WEST: ddb})
    s = dedupe.run(ddb, opts)
    assert (s["duplicate_keys"], s["released"], s["kept_until_survivor_outlasts"]) == (1, 0, 1)
    m = get_map(ddb, table, map_ident("k", EAST))
    assert m is not None and m.state == LIVE and m.resource == "e-00000", m


def test_dedupe_checks_the_extras_end_on_its_mapping(ddb: Any, table: str) -> None:
    """The end an extra's release is checked against is read again with its mapping (the
    end daemons serve), after the scan: an extension between the scan's read and the
    release keeps it."""
    seed_duplicates(ddb, table)
    k2_east = map_ident("k2", EAST)
    reads = [0]

    def extend_after_examine(kw: dict[str, Any]) -> None:
        key = (kw["Key"]["client_id"]["S"], kw["Key"]["resource"]["S"])
        if key == k2_east:
            reads[0] += 1
            if reads[0] == 2:  # examine read it; the release reads it again
                daemon_extend(ddb, table, "e-00004", NOW + 2 * HOUR)

    opts = dedupe.Options(table=table, region=EAST, now_us=NOW)
    s = dedupe.run(Wrapped(ddb, get_item=extend_after_examine), opts)
    assert reads[0] >= 2, "the hook never ran"
    assert s["errors"] == 0 and s["kept_until_survivor_outlasts"] == 1, s
    m = get_map(ddb, table, map_ident("k2", EAST))
    assert m is not None and m.state == LIVE and m.resource == "e-00004", m


def test_dedupe_survivor_must_outlast_the_extra_by_margin_and_skew(ddb: Any, table: str) -> None:
    """Found by the protocol checker: the extra's region stops serving the survivor at its
    end minus the margin on its own clock, which may run ahead by the skew bound; a survivor
    that outlasts the extra by the margin alone leaves a window of up to the skew where that
    region acquires another resource while apps still use the extra (I2)."""
    cfg = Config()
    seed_pool(ddb, table, region=EAST, count=2, prefix="e-")
    seed_pool(ddb, table, region=WEST, count=2, prefix="w-")
    by = int((cfg.skew_margin + cfg.max_clock_skew / 2) * US)  # more than the margin alone
    lease(ddb, table, "w-00000", "k", NOW + HOUR + by, acquired_us=NOW - 20 * US)
    lease(ddb, table, "e-00000", "k", NOW + HOUR, acquired_us=NOW - 10 * US)
    opts = dedupe.Options(table=table, region=EAST, now_us=NOW, peers={WEST: ddb})
    s = dedupe.run(ddb, opts)
    assert (s["released"], s["kept_until_survivor_outlasts"]) == (0, 1), s
    assert get(ddb, table, "e-00000").key == "k"
