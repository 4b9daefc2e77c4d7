"""Lease items: their types, names and time format. Pure: no I/O, time passed in.

The resource item R and the mapping item M (docs/schema.md; docs/design.md, "The items"), as
frozen dataclasses with the few predicates their callers filter with (``expired``,
``claimable``, ``holder_current``, ``remaining_us``). Times are integer microseconds since
the epoch, on the table fixed-width ISO-8601 strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .writes import ItemKey

US = 1_000_000
PARTITIONS = 10
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)

#: client_id and pool_id: no dots (they separate the ``partition`` fields), no '#' (reserved
#: for the table's meta and mapping items), short enough to keep keys small.
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
REGION_RE = re.compile(r"^[a-z0-9-]{1,32}$")
MAX_KEY_LEN = 512
MAX_RESOURCE_LEN = 1024

#: Partition key of the table's meta items (pool definitions, job state, headroom, counters).
#: '#' is not allowed in a client_id, so a meta item can never collide with a resource, and
#: meta items carry neither ``key`` nor ``partition``, so they appear in no index.
META_CLIENT = "#meta"
#: Partition key of what daemons report: their miss counters and the signal that they saw a
#: lease of the paper's agent. The one partition outside the clients' own that a daemon
#: writes, so that ``#meta`` (pool definitions, the rollout record) is written only by the
#: jobs and rasadmin, and IAM can say so (``dynamodb:LeadingKeys``, docs/operations.md).
HOSTS_CLIENT = "#hosts"
#: Partition key prefix of mapping items: ``#map#{client_id}#{pool_id}#{key}``. Mapping items
#: have no ``key``, ``pool_id``, ``partition`` or ``lease_available`` attribute: no index.
MAP_PREFIX = "#map#"
#: Partition key prefix of a strict pool's agreement items: ``#agree#{client}#{pool}#{key}``
#: (sort key ``#``), written only in the pool's home region (:mod:`rasd.core.agree`).
AGREE_PREFIX = "#agree#"
#: Mapping items are reaped by DynamoDB's TTL this long after their lease ends or is freed;
#: far longer than any request can stay in flight (a signed request is refused after minutes).
MAP_TTL_S = 24 * 3600

Item = dict[str, dict[str, Any]]  # DynamoDB low-level attribute map
Update = dict[str, Any]  # UpdateItem keyword arguments, without TableName

PENDING, LIVE, FREE = "pending", "live", "free"

#: Sort key prefix of the balancer's headroom meta items (one per client, pool and region).
HEADROOM_PREFIX = "headroom#"
#: NO_CAPACITY answers write nothing, so a region that runs dry would look idle to the
#: balancer. Each daemon reports its misses in a counter item of its own (docs/global.md).
MISS_PREFIX = "misses#"
MISS_TTL_S = 7 * 24 * 3600  # a counter of a host gone for a week is reaped by DynamoDB TTL


# --------------------------------------------------------------------------------------- time
def fmt_time(us: int) -> str:
    """Epoch microseconds -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (fixed width). The part up to
    the second is formatted once per second seen (a small cache): equal to
    :func:`fmt_time_plain`."""
    sec, frac = divmod(us, 1_000_000)
    head = _SECONDS.get(sec)
    if head is None:
        if len(_SECONDS) >= 1024:
            _SECONDS.clear()
        head = _SECONDS[sec] = (_EPOCH + timedelta(seconds=sec)).strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{head}{frac:06d}Z"


_SECONDS: dict[int, str] = {}


def fmt_time_plain(us: int) -> str:
    """:func:`fmt_time` without its cache (the reference in tests)."""
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(s: str) -> int:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` -> epoch microseconds. The part up to the second is
    parsed once per second seen (a small cache, as :func:`fmt_time` keeps)."""
    frac = s[20:26]
    if len(s) != 27 or s[-1] != "Z" or s[19] != "." or not (frac.isascii() and frac.isdigit()):
        raise ValueError(f"not a fixed-width UTC time: {s!r}")
    head = s[:19]
    sec = _PARSED.get(head)
    if sec is None:
        if len(_PARSED) >= 1024:
            _PARSED.clear()
        dt = datetime.fromisoformat(head).replace(tzinfo=UTC)
        sec = _PARSED[head] = (dt - _EPOCH) // _ONE_SECOND
    return sec * 1_000_000 + int(frac)


_PARSED: dict[str, int] = {}
_ONE_SECOND = timedelta(seconds=1)


def parse_time_plain(s: str) -> int:
    """:func:`parse_time` without its cache (the reference in tests)."""
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


def map_pk(client_id: str, pool_id: str, key: str) -> str:
    """Partition key of a key's mapping items (one item per region under it)."""
    return f"{MAP_PREFIX}{client_id}#{pool_id}#{key}"


def headroom_resource(client_id: str, pool_id: str, region: str) -> str:
    """Sort key of the balancer's headroom item for one (client, pool, region)."""
    return f"{HEADROOM_PREFIX}{client_id}#{pool_id}#{region}"


def miss_resource(client_id: str, pool_id: str, region: str, daemon_id: str) -> str:
    return f"{MISS_PREFIX}{client_id}#{pool_id}#{region}#{daemon_id}"


def ttl_after(until_us: int) -> int:
    """The ``ttl`` (epoch seconds) of an item DynamoDB reaps ``MAP_TTL_S`` after ``until_us``
    (mapping items after their lease ends or is freed, tombstones after their hold)."""
    return until_us // US + MAP_TTL_S


# ---------------------------------------------------------------------------------- types
@dataclass(frozen=True, slots=True)
class Pool:
    client_id: str
    pool_id: str
    max_lease_us: int
    #: a strict pool's home region: a key's first lease is agreed there (docs/global.md,
    #: "Strict pools"); None: a key may hold one lease per region, as in the paper
    home: str | None = None
    #: how long after its last confirmation a host that cannot reach DynamoDB keeps serving
    #: a cached lease of this pool (0: S, as any pool); docs/design.md, "An outage budget"
    outage_budget_us: int = 0
    #: how long an app's release keeps a resource of this pool unclaimable (0: the daemons'
    #: Q); rasadmin add-pool sets it with the budget, at least budget + skew + lag
    quarantine_us: int = 0


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
    #: token of the acquisition holding it, and the mapping version that acquisition wrote
    holder: str | None = None
    mver: int = 0
    #: the item's version as rasd's last write of the lease left it (None: not written)
    hver: int | None = None
    #: free but out of the available index until this time (an early free's quarantine)
    quarantine_until: str | None = None

    @property
    def leased(self) -> bool:
        return self.key is not None

    @property
    def ident(self) -> ItemKey:
        return (self.client_id, self.resource)

    def expired(self, now_us: int) -> bool:
        return self.lease_expires_us is not None and self.lease_expires_us <= now_us

    @property
    def holder_current(self) -> bool:
        """Does ``holder`` name the acquisition that holds the item now? Every write rasd
        makes to a held item moves ``hver`` with ``version``; a write by the paper's agent or
        its liberator moves ``version`` only, so a ``holder`` left behind by a lease that such
        a write ended is stale. (An item held without ``hver`` was written before ``hver``
        existed: its holder is taken as current.)"""
        return self.holder is not None and (self.hver is None or self.hver == self.version)

    def claimable(self, now_us: int) -> bool:
        """Free, and out of any quarantine, by ``now_us``."""
        return (
            self.key is None
            and self.lease_available is not None
            and self.lease_available <= fmt_time(now_us)
        )


@dataclass(frozen=True, slots=True)
class Mapping:
    """A key's mapping item in one region (see the module docstring)."""

    client_id: str
    pool_id: str
    key: str
    region: str
    ver: int
    state: str
    token: str | None = None
    resource: str | None = None
    rver: int = 0
    expires_us: int | None = None
    since_us: int = 0
    owner: str | None = None

    @property
    def ident(self) -> ItemKey:
        return (map_pk(self.client_id, self.pool_id, self.key), self.region)


@dataclass(frozen=True, slots=True)
class Lease:
    """A key's lease as the daemon serves it.

    ``version`` is the resource item's version when this lease was claimed: a later holder of
    the same resource always has a greater one, so apps can use it as a fencing token.
    ``token`` names the acquisition (the resource's ``holder``); None for a lease the daemon
    did not confirm by token (never the case for leases of its own region).
    """

    client_id: str
    pool_id: str
    key: str
    resource: str
    region: str
    expires_us: int
    version: int
    acquired_us: int = 0
    token: str | None = None

    def remaining_us(self, now_us: int) -> int:
        return self.expires_us - now_us
