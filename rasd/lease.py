"""Lease rules and the DynamoDB writes they make. Pure: no I/O, time is always passed in.

Theory of operation
-------------------
A resource item moves between two sparse indexes (see docs/schema.md):

* free:   ``lease_available`` set, ``key``/``lease_expires`` absent -> in ``available_resources``
* leased: ``key``/``lease_expires`` set, ``lease_available`` absent -> in ``leased_resources``

Every write is an UpdateItem conditional on the ``version`` that was read (and on the region
being the writer's own), and increments ``version``. A failed condition is a lost race, a
normal outcome that the caller handles by reading again or trying the next candidate.

The functions here build those UpdateItem requests (without ``TableName``) and decide the
rules: is a lease expired, should a sliding ``lease_expires`` trigger an extension, which of
several items holding one key is the real one. The daemon (``rasd.acquire``) and the jobs
(``rasd_jobs``) call them, and the unit tests drive them without DynamoDB.

All times are integers: microseconds since the epoch, UTC. On the table they are fixed-width
ISO-8601 strings ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` so string order is time order.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

US = 1_000_000
PARTITIONS = 10
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)

#: client_id and pool_id: no dots (they separate the ``partition`` fields), no '#' (reserved
#: for the table's meta items), short enough to keep keys small.
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
REGION_RE = re.compile(r"^[a-z0-9-]{1,32}$")
MAX_KEY_LEN = 512
MAX_RESOURCE_LEN = 1024

#: Partition key of the table's meta items (pool definitions, job state, headroom, counters).
#: '#' is not allowed in a client_id, so a meta item can never collide with a resource, and
#: meta items carry neither ``key`` nor ``partition``, so they appear in no index.
META_CLIENT = "#meta"
ACQ_PREFIX = "#acq#"

Item = dict[str, dict[str, Any]]  # DynamoDB low-level attribute map
Update = dict[str, Any]  # UpdateItem keyword arguments, without TableName


# --------------------------------------------------------------------------------------- time
def fmt_time(us: int) -> str:
    """Epoch microseconds -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (fixed width)."""
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(s: str) -> int:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` -> epoch microseconds."""
    if len(s) != 27 or s[-1] != "Z":
        raise ValueError(f"not a fixed-width UTC time: {s!r}")
    dt = datetime.fromisoformat(s[:-1]).replace(tzinfo=UTC)
    return (dt - _EPOCH) // _ONE_US


# ---------------------------------------------------------------------------------- names
def valid_name(s: object) -> bool:
    return isinstance(s, str) and NAME_RE.match(s) is not None


def partition_name(client_id: str, pool_id: str, region: str, n: int) -> str:
    return f"{client_id}.{pool_id}.{region}.{n}"


def partition_of(resource: str) -> int:
    """Stable sub-partition for a resource (FNV-1a, so it does not depend on PYTHONHASHSEED)."""
    h = 0x811C9DC5
    for b in resource.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % PARTITIONS


def pool_meta_key(client_id: str, pool_id: str) -> Item:
    return {"client_id": {"S": META_CLIENT}, "resource": {"S": f"pool#{client_id}#{pool_id}"}}


def acq_key(client_id: str, pool_id: str, region: str, key: str) -> Item:
    """Key of the short-lived acquisition lock item for (client, pool, region, key)."""
    return {
        "client_id": {"S": f"{ACQ_PREFIX}{client_id}#{pool_id}#{region}"},
        "resource": {"S": key},
    }


# ---------------------------------------------------------------------------------- types
@dataclass(frozen=True, slots=True)
class Pool:
    client_id: str
    pool_id: str
    max_lease_us: int


@dataclass(frozen=True, slots=True)
class ResourceItem:
    """One resource item as read from the table (either index or the base table)."""

    client_id: str
    resource: str
    pool_id: str
    region: str
    partition: str
    version: int
    key: str | None = None
    lease_expires_us: int | None = None
    lease_available: str | None = None
    lease_acquired_us: int | None = None
    #: the daemon that made the current claim (see acquire.py: a claim made alongside a lock
    #: its daemon lost is not a lease)
    claimed_by: str | None = None

    @property
    def leased(self) -> bool:
        return self.key is not None

    def expired(self, now_us: int) -> bool:
        return self.lease_expires_us is not None and self.lease_expires_us <= now_us


@dataclass(frozen=True, slots=True)
class Lease:
    """A key's lease as the daemon knows it."""

    client_id: str
    pool_id: str
    key: str
    resource: str
    region: str
    expires_us: int
    version: int
    acquired_us: int = 0

    def remaining_us(self, now_us: int) -> int:
        return self.expires_us - now_us


def item_from_ddb(item: Item) -> ResourceItem:
    def s(name: str) -> str | None:
        v = item.get(name)
        return v["S"] if v is not None else None

    exp = s("lease_expires")
    acq = s("lease_acquired")
    return ResourceItem(
        client_id=item["client_id"]["S"],
        resource=item["resource"]["S"],
        pool_id=s("pool_id") or "",
        region=s("region") or "",
        partition=s("partition") or "",
        version=int(item.get("version", {"N": "0"})["N"]),
        key=s("key"),
        lease_expires_us=parse_time(exp) if exp else None,
        lease_available=s("lease_available"),
        lease_acquired_us=parse_time(acq) if acq else None,
        claimed_by=s("claimed_by"),
    )


def lease_from_item(item: ResourceItem) -> Lease:
    assert item.key is not None and item.lease_expires_us is not None
    # client, pool and region repeat across every cached lease: share one string each.
    return Lease(
        client_id=sys.intern(item.client_id),
        pool_id=sys.intern(item.pool_id),
        key=item.key,
        resource=item.resource,
        region=sys.intern(item.region),
        expires_us=item.lease_expires_us,
        version=item.version,
        acquired_us=item.lease_acquired_us or 0,
    )


def new_resource_item(
    client_id: str, pool_id: str, region: str, resource: str, now_us: int
) -> Item:
    """A free resource item as ``rasadmin add-resources`` writes it."""
    return {
        "client_id": {"S": client_id},
        "resource": {"S": resource},
        "pool_id": {"S": pool_id},
        "region": {"S": region},
        "partition": {"S": partition_name(client_id, pool_id, region, partition_of(resource))},
        "lease_available": {"S": fmt_time(now_us)},
        "version": {"N": "0"},
    }


# ---------------------------------------------------------------------------------- rules
def check_expiry(requested_us: int, now_us: int, max_lease_us: int) -> str | None:
    """Why ``requested_us`` is not an acceptable lease end, or None when it is."""
    if requested_us <= now_us:
        return "lease_expires is in the past"
    if requested_us - now_us > max_lease_us:
        return f"lease_expires is beyond the pool's maximum lease of {max_lease_us // US}s"
    return None


def cache_until(expires_us: int, skew_margin_us: int) -> int:
    """A cached lease is served only until its end minus the clock-skew margin."""
    return expires_us - skew_margin_us


def should_extend(lease: Lease, requested_us: int, now_us: int, fraction: float) -> bool:
    """Refresh-ahead rule for sliding ``lease_expires``.

    Extend only when the caller asks for more than the lease has AND the time left has fallen
    below ``fraction`` of the requested duration. With fraction 0.5 and a sliding "now + 1h",
    a key is written about once per half hour, not on every call. Never shortens.
    """
    if requested_us <= lease.expires_us:
        return False
    return lease.remaining_us(now_us) < fraction * (requested_us - now_us)


def pick(items: list[ResourceItem]) -> ResourceItem | None:
    """The one item that stands for a key when several hold it (duplicates from races).

    Earliest claim wins, then the smaller resource: the same choice ``ras-dedupe`` makes, so
    every daemon in every region converges on the resource that survives the clean-up.
    """
    if not items:
        return None
    return min(items, key=lambda it: (it.lease_acquired_us or 0, it.region, it.resource))


# ------------------------------------------------------------------------------- writes
_NAMES_ALL = {"#k": "key", "#r": "region", "#p": "partition"}


def _key(client_id: str, resource: str) -> Item:
    return {"client_id": {"S": client_id}, "resource": {"S": resource}}


def claim(
    item: ResourceItem, key: str, expires_us: int, now_us: int, region: str, owner: str = ""
) -> Update:
    """Take a free item: requires the version read, that it is free, and our region.
    ``owner`` (the claiming daemon) is recorded as ``claimed_by``."""
    upd: Update = {
        "Key": _key(item.client_id, item.resource),
        "UpdateExpression": (
            "SET #k = :key, lease_expires = :exp, lease_acquired = :now, version = :nv "
            "REMOVE lease_available, claimed_by"
        ),
        "ConditionExpression": (
            "version = :v AND attribute_exists(lease_available) AND #r = :region"
        ),
        "ExpressionAttributeNames": {"#k": "key", "#r": "region"},
        "ExpressionAttributeValues": {
            ":key": {"S": key},
            ":exp": {"S": fmt_time(expires_us)},
            ":now": {"S": fmt_time(now_us)},
            ":v": {"N": str(item.version)},
            ":nv": {"N": str(item.version + 1)},
            ":region": {"S": region},
        },
    }
    if owner:
        upd["UpdateExpression"] = (
            "SET #k = :key, lease_expires = :exp, lease_acquired = :now, version = :nv, "
            "claimed_by = :owner REMOVE lease_available"
        )
        upd["ExpressionAttributeValues"][":owner"] = {"S": owner}
    return upd


def claim_verdict(item: ResourceItem, lock: Item | None, now_us: int, fresh_us: int) -> bool | None:
    """Is ``item``'s claim a lease, given the key's acquisition lock as read with it?

    A daemon sends its claim together with the per-key lock and gives the claim back if it
    loses the lock; until then the claim is visible but is not a lease. True: it is a lease
    (not fresh, no claimant recorded, or its claimant holds the lock). False: another daemon
    holds the lock, so this claim is being given back. None: undecided, the claimant's lock
    write has not landed yet; read again. A claim older than ``fresh_us`` is trusted.
    """
    if item.claimed_by is None or (item.lease_acquired_us or 0) < now_us - fresh_us:
        return True
    owner = lock.get("lock_owner", {}).get("S") if lock else None
    if owner == item.claimed_by:
        return True
    until = lock.get("lock_expires", {}).get("S") if lock else None
    if owner is not None and until is not None and parse_time(until) >= now_us:
        return False
    return None


def relet(lease: Lease, expires_us: int, now_us: int, region: str) -> Update:
    """Re-lease an expired, not yet liberated item to the same key it holds."""
    return {
        "Key": _key(lease.client_id, lease.resource),
        "UpdateExpression": "SET lease_expires = :exp, lease_acquired = :now, version = :nv",
        "ConditionExpression": "version = :v AND #k = :key AND #r = :region",
        "ExpressionAttributeNames": {"#k": "key", "#r": "region"},
        "ExpressionAttributeValues": {
            ":key": {"S": lease.key},
            ":exp": {"S": fmt_time(expires_us)},
            ":now": {"S": fmt_time(now_us)},
            ":v": {"N": str(lease.version)},
            ":nv": {"N": str(lease.version + 1)},
            ":region": {"S": region},
        },
    }


def extend(lease: Lease, expires_us: int, region: str) -> Update:
    """Push ``lease_expires`` later. Conditional on version, key and region; never shortens."""
    return {
        "Key": _key(lease.client_id, lease.resource),
        "UpdateExpression": "SET lease_expires = :exp, version = :nv",
        "ConditionExpression": (
            "version = :v AND #k = :key AND #r = :region AND lease_expires < :exp"
        ),
        "ExpressionAttributeNames": {"#k": "key", "#r": "region"},
        "ExpressionAttributeValues": {
            ":key": {"S": lease.key},
            ":exp": {"S": fmt_time(expires_us)},
            ":v": {"N": str(lease.version)},
            ":nv": {"N": str(lease.version + 1)},
            ":region": {"S": region},
        },
    }


def release(lease: Lease, now_us: int, region: str) -> Update:
    """Make the item free again (``lease_available`` = now); conditional on version and key."""
    return {
        "Key": _key(lease.client_id, lease.resource),
        "UpdateExpression": (
            "SET lease_available = :now, version = :nv "
            "REMOVE #k, lease_expires, lease_acquired, claimed_by"
        ),
        "ConditionExpression": "version = :v AND #k = :key AND #r = :region",
        "ExpressionAttributeNames": {"#k": "key", "#r": "region"},
        "ExpressionAttributeValues": {
            ":key": {"S": lease.key},
            ":now": {"S": fmt_time(now_us)},
            ":v": {"N": str(lease.version)},
            ":nv": {"N": str(lease.version + 1)},
            ":region": {"S": region},
        },
    }


def liberate(item: ResourceItem, now_us: int) -> Update:
    """Free an expired lease (the liberator). Conditional on version AND the expiry it read,
    so a lease extended in the meantime is left alone. Only for the item's own region."""
    assert item.key is not None and item.lease_expires_us is not None
    return {
        "Key": _key(item.client_id, item.resource),
        "UpdateExpression": (
            "SET lease_available = :now, version = :nv "
            "REMOVE #k, lease_expires, lease_acquired, claimed_by"
        ),
        "ConditionExpression": "version = :v AND lease_expires = :exp AND #r = :region",
        "ExpressionAttributeNames": {"#k": "key", "#r": "region"},
        "ExpressionAttributeValues": {
            ":now": {"S": fmt_time(now_us)},
            ":exp": {"S": fmt_time(item.lease_expires_us)},
            ":v": {"N": str(item.version)},
            ":nv": {"N": str(item.version + 1)},
            ":region": {"S": item.region},
        },
    }


def move(item: ResourceItem, to_region: str) -> Update:
    """Move a FREE item to another region (the balancer). Never touches a leased item."""
    return {
        "Key": _key(item.client_id, item.resource),
        "UpdateExpression": "SET #r = :to, #p = :part, version = :nv",
        "ConditionExpression": (
            "version = :v AND #r = :from AND attribute_exists(lease_available) "
            "AND attribute_not_exists(#k)"
        ),
        "ExpressionAttributeNames": dict(_NAMES_ALL),
        "ExpressionAttributeValues": {
            ":to": {"S": to_region},
            ":from": {"S": item.region},
            ":part": {
                "S": partition_name(
                    item.client_id, item.pool_id, to_region, partition_of(item.resource)
                )
            },
            ":v": {"N": str(item.version)},
            ":nv": {"N": str(item.version + 1)},
        },
    }


def drop_acq_lock(
    client_id: str, pool_id: str, region: str, key: str, owner: str, now_us: int
) -> Update:
    """Expire our acquisition lock at once (after a release), so the key can be re-acquired."""
    return {
        "Key": acq_key(client_id, pool_id, region, key),
        "UpdateExpression": "SET lock_expires = :now",
        "ConditionExpression": "lock_owner = :owner",
        "ExpressionAttributeValues": {":owner": {"S": owner}, ":now": {"S": fmt_time(now_us)}},
    }


def take_acq_lock(
    client_id: str, pool_id: str, region: str, key: str, owner: str, now_us: int, hold_us: int
) -> Update:
    """Short lock that makes one daemon per region the acquirer of a new key.

    Without it two daemons that both miss a brand-new key would each claim a resource for it.
    The lock expires by itself (``lock_expires``), so a crashed acquirer blocks nobody for
    long; ``ttl`` lets DynamoDB's TTL reap the item later.
    """
    return {
        "Key": acq_key(client_id, pool_id, region, key),
        "UpdateExpression": "SET lock_owner = :owner, lock_expires = :until, #ttl = :ttl",
        "ConditionExpression": (
            "attribute_not_exists(lock_expires) OR lock_expires < :now OR lock_owner = :owner"
        ),
        "ExpressionAttributeNames": {"#ttl": "ttl"},
        "ExpressionAttributeValues": {
            ":owner": {"S": owner},
            ":until": {"S": fmt_time(now_us + hold_us)},
            ":now": {"S": fmt_time(now_us)},
            ":ttl": {"N": str((now_us + hold_us) // US + 3600)},
        },
    }


# ------------------------------------------------------------------ unmet demand (misses)
#: NO_CAPACITY answers write nothing, so a region that runs dry would look idle to the
#: balancer. Each daemon reports its misses in a counter item of its own (docs/global.md).
MISS_PREFIX = "misses#"
MISS_TTL_S = 7 * 24 * 3600  # a counter of a host gone for a week is reaped by DynamoDB TTL


def miss_resource(client_id: str, pool_id: str, region: str, daemon_id: str) -> str:
    return f"{MISS_PREFIX}{client_id}#{pool_id}#{region}#{daemon_id}"


def miss_report_update(
    client_id: str, pool_id: str, region: str, daemon_id: str, n: int, now_us: int
) -> dict[str, Any]:
    """UpdateItem kwargs (without ``TableName``) with which a daemon reports ``n`` NO_CAPACITY
    answers since its previous report. One item per daemon, written only by that daemon in its
    own region, so concurrent ADDs never meet in different replicas of the global table."""
    if n <= 0:
        raise ValueError("report a positive number of misses")
    if not daemon_id or "#" in daemon_id:
        raise ValueError("daemon_id must be non-empty and contain no '#'")
    return {
        "Key": {
            "client_id": {"S": META_CLIENT},
            "resource": {"S": miss_resource(client_id, pool_id, region, daemon_id)},
        },
        "UpdateExpression": "ADD #c :n SET #u = :now, #ttl = :ttl",
        "ExpressionAttributeNames": {"#c": "count", "#u": "updated", "#ttl": "ttl"},
        "ExpressionAttributeValues": {
            ":n": {"N": str(n)},
            ":now": {"S": fmt_time(now_us)},
            ":ttl": {"N": str(now_us // US + MISS_TTL_S)},
        },
    }
