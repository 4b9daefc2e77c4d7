"""A stand-in for DynamoDB global-table replication between separate moto backends.

One reader thread per source region polls that backend's DynamoDB stream (moto: one shard per
table) and queues every *local* write for the other regions; applier threads apply them in each
destination ``lag`` seconds after they were read (so the effective lag is ``lag`` plus the poll
period, up to 50 ms, plus the apply time). A destination has eight applier lanes and an item
always takes the same one: one item's writes stay in order, and a burst of writes of different
items (a liberator run, a balancer's moves) is applied in parallel, not queued behind one
another. Like global tables, nothing orders writes of different items. The achieved lag is
measured end to end, from each write (its stream record's creation time) to its copy applied.

Conflict rule (last writer wins, :func:`wins`):

* A write's **stamp** is ``(version, time_ms, region, seq)``: the item's ``version`` attribute
  (items without one, the meta items, count as 0), the stream record's
  ``ApproximateCreationDateTime`` in ms, the region it was written in, and its stream sequence
  number (which only orders writes of one region).
* A replicated write is applied iff its stamp is greater than the stamp of the destination's
  current item. For versioned items the version comparison is done by DynamoDB itself
  (``ConditionExpression: attribute_not_exists(client_id) OR version < :v``), atomically with
  the destination's own daemons; only on an equal version (two regions wrote the same item from
  the same base version: a true conflict) does the time decide, then the region name. Both
  directions use the same rule, so the replicas converge to the same winner.
* This is the global tables rule (latest write by time) for every conflict between writes
  made from the same base version, which is what the conditional writes of rasd produce. It
  differs only when one replica made two writes (v6, v7) while another made one later (v6):
  global tables keep the later v6, we keep v7. rasd never writes another region's items
  unless a job is run without ``--peer-endpoint`` (docs/global.md, "Replicas").

A write that a later write of the same item *from the same region* reaches a destination's
queue behind is not applied there (``superseded``): the later one carries the whole item and
a greater stamp, so the destination ends in the same state with one write less (an
acquisition writes its mapping item twice within milliseconds: pending, then live). Writes of
one item from different regions are never coalesced: those go through the conflict rule.

Writes the replicator makes show up in the destination's own stream; they are recognised (by a
hash of the image written, counted per destination) and neither replicated again nor audited.

Every item is replicated: resource items, mapping items (``#map#...``: one per key and
region, written only in their region; daemons elsewhere read them from their replica to serve
another region's lease) and meta items (misses, headroom, pool definitions, locks). A mapping
item's stamp uses its ``ver`` (it has no ``version``), so the later write of one item wins.

Audit: every local write of a resource item is classified (acquire, release, move) and written
as one JSON line to the audit file, with a flag when a *leased* item changed region (a move
of a leased item: must never happen). An acquisition carries the claim's ``holder`` token; a
local write of a mapping item that names a claim (``pending``/``live``) is audited as ``map``
with its token, so that the report can tell a lease (a claim some mapping named) from a claim
that lost the race for the key's mapping and was never served.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: (version, time_ms, region, seq)
Stamp = tuple[int, int, str, int]

MAP_PREFIX = "#map#"
AGREE_PREFIX = "#agree#"


# ------------------------------------------------------------------------------------ pure
def wins(incoming: Stamp, current: Stamp | None) -> bool:
    """Last writer wins: does a replicated write with ``incoming`` stamp replace the current
    item (whose stamp is ``current``; None: the destination has no such item)?

    Higher version first; on equal versions the later write (time in ms), then the greater
    region name, then (same region) the later stream sequence number. Equal stamps: no (it
    is the same write)."""
    if current is None:
        return True
    return incoming > current


def stamp_of(record: dict[str, Any], region: str) -> Stamp:
    ddb = record.get("dynamodb") or {}
    img = ddb.get("NewImage") or ddb.get("OldImage") or {}
    # resource items: ``version``; mapping items: ``ver``; meta items: neither (0)
    version = int((img.get("version") or img.get("ver") or {}).get("N", "0"))
    return (version, _time_ms(ddb), region, int(ddb.get("SequenceNumber", "0")))


def _time_ms(ddb: dict[str, Any]) -> int:
    t = ddb.get("ApproximateCreationDateTime")
    if isinstance(t, datetime):
        return int(t.timestamp() * 1000)
    if isinstance(t, (int, float)):
        return int(t * 1000)
    return int(time.time() * 1000)


def image_hash(image: dict[str, Any] | None) -> str:
    return hashlib.sha1(json.dumps(image, sort_keys=True).encode()).hexdigest()


def item_key(record: dict[str, Any]) -> tuple[str, str]:
    keys = (record.get("dynamodb") or {}).get("Keys") or {}
    return keys["client_id"]["S"], keys["resource"]["S"]


def _s(img: dict[str, Any] | None, name: str) -> str | None:
    v = (img or {}).get(name)
    return v.get("S") if isinstance(v, dict) else None


def audit_events(record: dict[str, Any], region: str) -> list[dict[str, Any]]:
    """What a local write did to a resource item, or which claim a mapping item names (meta
    items: nothing)."""
    ddb = record.get("dynamodb") or {}
    old, new = ddb.get("OldImage"), ddb.get("NewImage")
    client, resource = item_key(record)
    t = _time_ms(ddb)
    if client.startswith(MAP_PREFIX):
        state, token = _s(new, "state"), _s(new, "token")
        if state not in ("pending", "live") or token is None:
            return []
        key = client[len(MAP_PREFIX) :].split("#", 2)[-1]
        return [
            {
                "ev": "map",
                "key": key,
                "pool": client[len(MAP_PREFIX) :].split("#", 2)[1],
                "region": resource,
                "state": state,
                "token": token,
                "res": _s(new, "res"),
                "t": t,
                "in": region,
            }
        ]
    if client.startswith(AGREE_PREFIX):  # a strict pool's agreement: the lease it names
        token = _s(new, "token")
        if token is None:
            return []
        return [{"ev": "agree", "token": token, "res": _s(new, "res"), "t": t, "in": region}]
    if client.startswith("#"):
        return []
    ok, nk = _s(old, "key"), _s(new, "key")
    orr, nr = _s(old, "region"), _s(new, "region")
    out: list[dict[str, Any]] = []
    if orr and nr and orr != nr:
        out.append(
            {
                "ev": "move",
                "res": resource,
                "from": orr,
                "to": nr,
                "t": t,
                "leased": ok is not None or nk is not None,
                "in": region,
            }
        )
    if ok is not None and ok != nk:
        out.append({"ev": "rel", "res": resource, "key": ok, "t": t, "in": region})
    if nk is not None and nk != ok:
        out.append(
            {
                "ev": "acq",
                "res": resource,
                "key": nk,
                "pool": _s(new, "pool_id"),
                "t": t,
                "exp": _s(new, "lease_expires"),
                "region": nr,
                "holder": _s(new, "holder"),
                "in": region,
            }
        )
    return out


# ------------------------------------------------------------------------------ the threads
@dataclass(order=True)
class _Pending:
    due: float
    seq: int
    src: str
    record: dict[str, Any]
    stamp: Stamp
    read_at: float
    deferrals: int = 0


class Replicator:
    """Replicates ``table`` between ``endpoints`` (region -> URL) with ``lag`` seconds."""

    def __init__(
        self,
        endpoints: dict[str, str],
        table: str,
        lag: float,
        audit_path: str | None = None,
        poll_s: float = 0.05,
        appliers: int = 8,
    ) -> None:
        import boto3
        from botocore.config import Config as BotoConfig

        self.endpoints = endpoints
        self.table = table
        self.lag = lag
        self.poll_s = poll_s
        cfg = BotoConfig(
            retries={"max_attempts": 10, "mode": "standard"}, max_pool_connections=2 * appliers
        )
        kw = {"aws_access_key_id": "x", "aws_secret_access_key": "x", "config": cfg}
        self.ddb = {
            r: boto3.client("dynamodb", endpoint_url=u, region_name=r, **kw)  # type: ignore[call-overload]
            for r, u in endpoints.items()
        }
        self.streams = {
            r: boto3.client("dynamodbstreams", endpoint_url=u, region_name=r, **kw)  # type: ignore[call-overload]
            for r, u in endpoints.items()
        }
        self.lock = threading.Lock()
        self.known: dict[str, dict[tuple[str, str], Stamp]] = {r: {} for r in endpoints}
        self.echoes: dict[str, Counter[tuple[tuple[str, str], str]]] = {
            r: Counter() for r in endpoints
        }
        self.appliers = appliers
        #: (destination, lane) -> its writes due, by due time; an item always takes one lane
        self.queues: dict[tuple[str, int], list[_Pending]] = {
            (r, i): [] for r in endpoints for i in range(appliers)
        }
        #: (destination, item, source region) -> seq of the newest record queued
        self.newest: dict[tuple[str, tuple[str, str], str], int] = {}
        self.cv = {q: threading.Condition(self.lock) for q in self.queues}
        self.stats: Counter[str] = Counter()
        self.lags: list[float] = []
        #: from the record read to its copy applied (the applier's share of the lag)
        self.queue_lags: list[float] = []
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.iterators: dict[str, str] = {}
        self._seq = 0
        self._audit = open(audit_path, "a") if audit_path else None  # noqa: SIM115
        self.last_activity = time.monotonic()

    # -- lifecycle
    def start(self) -> None:
        """Start at the streams' current ends (the seeded state is already in every replica)."""
        for r in self.endpoints:
            arn = self.ddb[r].describe_table(TableName=self.table)["Table"]["LatestStreamArn"]
            shard = self.streams[r].describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
            self.iterators[r] = self.streams[r].get_shard_iterator(
                StreamArn=arn, ShardId=shard[0]["ShardId"], ShardIteratorType="LATEST"
            )["ShardIterator"]
        for r in self.endpoints:
            t = threading.Thread(target=self._read, args=(r,), name=f"read-{r}", daemon=True)
            t.start()
            self.threads.append(t)
        for dst, lane in self.queues:
            t = threading.Thread(
                target=self._apply, args=(dst, lane), name=f"apply-{dst}-{lane}", daemon=True
            )
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stop_event.set()
        with self.lock:
            for c in self.cv.values():
                c.notify_all()
        for t in self.threads:
            t.join(5)
        if self._audit:
            self._audit.close()

    def idle_for(self) -> float:
        """Seconds since the last record was read or applied (and nothing is queued)."""
        with self.lock:
            if any(self.queues.values()):
                return 0.0
            return time.monotonic() - self.last_activity

    def summary(self) -> dict[str, Any]:
        lags = sorted(self.lags)
        queued = sorted(self.queue_lags)

        def pct(p: float, xs: list[float] = lags) -> float | None:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None

        return {
            "lag_s": self.lag,
            "applied": self.stats["applied"],
            "local_records": self.stats["local"],
            "echoes_skipped": self.stats["echo"],
            "mapping_records": self.stats["mapping"],
            "lww_discarded": self.stats["discarded"],
            "superseded": self.stats["superseded"],
            "conflicts": self.stats["conflicts"],
            "conflicts_won": self.stats["conflicts_won"],
            "deferred": self.stats["deferred"],
            "errors": self.stats["errors"],
            "leased_moves": self.stats["leased_moves"],
            "achieved_lag_p50_s": pct(0.5),
            "achieved_lag_p99_s": pct(0.99),
            "achieved_lag_max_s": round(lags[-1], 3) if lags else None,
            "read_to_applied_p99_s": pct(0.99, queued),
        }

    # -- reading
    def _read(self, region: str) -> None:
        streams = self.streams[region]
        while not self.stop_event.is_set():
            try:
                resp = streams.get_records(ShardIterator=self.iterators[region], Limit=1000)
            except Exception as exc:  # noqa: BLE001 - keep replicating; counted
                self._inc("errors")
                print(f"replicator: read {region}: {exc!r}", file=sys.stderr)
                time.sleep(0.2)
                continue
            self.iterators[region] = resp["NextShardIterator"]
            recs = resp.get("Records", [])
            if not recs:
                time.sleep(self.poll_s)
                continue
            now = time.monotonic()
            for rec in recs:
                self._on_record(region, rec, now)

    def _on_record(self, region: str, rec: dict[str, Any], now: float) -> None:
        k = item_key(rec)
        ddb = rec.get("dynamodb") or {}
        img = ddb.get("NewImage")
        h = image_hash(img) if img is not None else "REMOVE"
        st = stamp_of(rec, region)
        with self.lock:
            self.last_activity = now
            echo = self.echoes[region]
            if echo[(k, h)] > 0:
                echo[(k, h)] -= 1
                if echo[(k, h)] == 0:
                    del echo[(k, h)]
                self.stats["echo"] += 1
                return
            self.stats["local"] += 1
            self.known[region][k] = st
            if k[0].startswith(MAP_PREFIX):
                self.stats["mapping"] += 1
            for dst in self.endpoints:
                if dst == region:
                    continue
                self._seq += 1
                self.newest[(dst, k, region)] = self._seq
                q = (dst, self._lane(k))
                heapq.heappush(
                    self.queues[q], _Pending(now + self.lag, self._seq, region, rec, st, now)
                )
                self.cv[q].notify()
        events = audit_events(rec, region)
        for ev in events:
            if ev["ev"] == "move" and ev["leased"]:
                self._inc("leased_moves")
        if events and self._audit:
            for ev in events:
                self._audit.write(json.dumps(ev) + "\n")
            self._audit.flush()

    # -- applying
    def _lane(self, k: tuple[str, str]) -> int:
        """The applier lane of an item: one per item, so its writes stay in order."""
        return zlib.crc32(f"{k[0]}\0{k[1]}".encode()) % self.appliers

    def _apply(self, dst: str, lane: int) -> None:
        cv = self.cv[(dst, lane)]
        q = self.queues[(dst, lane)]
        while True:
            with self.lock:
                while not self.stop_event.is_set():
                    if q and q[0].due <= time.monotonic():
                        break
                    cv.wait(max(0.001, q[0].due - time.monotonic()) if q else 0.5)
                if self.stop_event.is_set():
                    return
                p = heapq.heappop(q)
                nk = (dst, item_key(p.record), p.src)
                if self.newest.get(nk, p.seq) > p.seq:
                    self.stats["superseded"] += 1  # a later write of this item is queued
                    continue
                if self.newest.get(nk) == p.seq:
                    del self.newest[nk]
            try:
                self._apply_one(dst, p)
            except Exception as exc:  # noqa: BLE001 - keep replicating; counted
                self._inc("errors")
                print(f"replicator: apply {p.src}->{dst}: {exc!r}", file=sys.stderr)
            with self.lock:
                self.last_activity = time.monotonic()

    def _inc(self, name: str) -> None:
        with self.lock:
            self.stats[name] += 1

    def _register_echo(self, dst: str, k: tuple[str, str], h: str, delta: int) -> None:
        with self.lock:
            self.echoes[dst][(k, h)] += delta
            if self.echoes[dst][(k, h)] <= 0:
                del self.echoes[dst][(k, h)]

    def _apply_one(self, dst: str, p: _Pending) -> None:
        from botocore.exceptions import ClientError

        ddb = self.ddb[dst]
        rec = p.record
        k = item_key(rec)
        img = (rec.get("dynamodb") or {}).get("NewImage")
        key_attrs = {"client_id": {"S": k[0]}, "resource": {"S": k[1]}}
        if img is None:  # REMOVE
            with self.lock:
                cur = self.known[dst].get(k)
            if not wins(p.stamp, cur):
                self._inc("discarded")
                return
            self._register_echo(dst, k, "REMOVE", 1)
            ddb.delete_item(TableName=self.table, Key=key_attrs)
            self._done(dst, k, p)
            return
        h = image_hash(img)
        if "version" not in img:  # meta items: one writer each; time decides
            with self.lock:
                cur = self.known[dst].get(k)
            if not wins(p.stamp, cur):
                self._inc("discarded")
                return
            self._register_echo(dst, k, h, 1)
            ddb.put_item(TableName=self.table, Item=img)
            self._done(dst, k, p)
            return
        v = int(img["version"]["N"])
        self._register_echo(dst, k, h, 1)
        try:
            ddb.put_item(
                TableName=self.table,
                Item=img,
                ConditionExpression="attribute_not_exists(client_id) OR version < :v",
                ExpressionAttributeValues={":v": {"N": str(v)}},
            )
            self._done(dst, k, p)
            return
        except ClientError as exc:
            self._register_echo(dst, k, h, -1)
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
        # The destination is at version >= v: older (discard) or a true conflict (equal).
        cur_item = ddb.get_item(TableName=self.table, Key=key_attrs, ConsistentRead=True).get(
            "Item"
        )
        cur_v = int((cur_item or {}).get("version", {}).get("N", "-1"))
        if cur_v > v or cur_item == img:
            self._inc("discarded" if cur_v > v else "same")
            return
        # equal versions, different content: a conflict. We need the destination's stamp.
        with self.lock:
            cur = self.known[dst].get(k)
        if cur is None or cur[0] != v:
            if p.deferrals < 100:  # the destination's own record is not read yet: wait
                p.deferrals += 1
                p.due = time.monotonic() + 0.02
                with self.lock:
                    self.stats["deferred"] += 1
                    heapq.heappush(self.queues[(dst, self._lane(k))], p)
                return
            cur = (v, 0, "", 0)  # never seen: treat the destination's write as the oldest
        self._inc("conflicts")
        if not wins(p.stamp, cur):
            self._inc("discarded")
            return
        self._register_echo(dst, k, h, 1)
        try:
            ddb.put_item(
                TableName=self.table,
                Item=img,
                ConditionExpression="version = :v",
                ExpressionAttributeValues={":v": {"N": str(v)}},
            )
            self._inc("conflicts_won")
            self._done(dst, k, p)
        except ClientError as exc:
            self._register_echo(dst, k, h, -1)
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
            self._inc("discarded")  # the destination moved on meanwhile: it is newer

    def _done(self, dst: str, k: tuple[str, str], p: _Pending) -> None:
        now = time.monotonic()
        with self.lock:
            self.known[dst][k] = p.stamp
            self.stats["applied"] += 1
            if len(self.lags) < 200_000:
                # end to end: from the write (its stream record's creation time, in ms) to
                # its copy applied here; the hosts' clocks are one
                self.lags.append(time.time() - p.stamp[1] / 1000)
                self.queue_lags.append(now - p.read_at)


# ------------------------------------------------------------------------ subprocess entry
def command(
    endpoints: dict[str, str], table: str, lag: float, audit_path: str | None = None
) -> list[str]:
    """The child's command line (``python -m sim.replicator ...``, see :func:`main`): the
    simulation and the chaos run start it so, each beside its own backends."""
    cmd = [sys.executable, "-m", "sim.replicator", "--table", table, "--lag", str(lag)]
    if audit_path:
        cmd += ["--audit", audit_path]
    for r, u in endpoints.items():
        cmd += ["--endpoint", f"{r}={u}"]
    return cmd


def settle(proc: subprocess.Popen[str], quiet_s: float, timeout: float = 30.0) -> bool:
    """Wait until the child (started with :func:`command`, text mode, pipes for stdin and
    stdout) has had nothing to do for ``quiet_s`` seconds: every write read so far is
    applied. False: still busy after ``timeout`` seconds."""
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.stdin.write("IDLE?\n")
        proc.stdin.flush()
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"replicator exited ({proc.poll()})")
            if line.startswith("IDLE "):
                break
        idle = float(line.split()[1])
        if idle >= quiet_s:
            return True
        time.sleep(max(0.05, quiet_s - idle))
    return False


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.replicator --endpoint R=URL ... --table T --lag S --audit F``: runs until
    stdin closes, then prints its summary as one JSON line on stdout."""
    ap = argparse.ArgumentParser(prog="sim.replicator")
    ap.add_argument("--endpoint", action="append", required=True, metavar="REGION=URL")
    ap.add_argument("--table", required=True)
    ap.add_argument("--lag", type=float, default=1.0)
    ap.add_argument("--audit", default=None)
    args = ap.parse_args(argv)
    endpoints = dict(e.split("=", 1) for e in args.endpoint)
    rep = Replicator(endpoints, args.table, args.lag, args.audit)
    rep.start()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "IDLE?":
            print(f"IDLE {rep.idle_for():.3f}", flush=True)
    rep.stop()
    print(json.dumps(rep.summary()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
