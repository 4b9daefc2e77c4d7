"""Lease items, their rules and every write made to them. Pure: no I/O, time passed in.

Theory of operation (the argument is in docs/design.md, "Invariants")
---------------------------------------------------------------------
Two kinds of item carry a lease (docs/schema.md):

* the **resource item** R (``client_id``, ``resource``): free (``lease_available`` set: since
  when it may be claimed) or held (``key``, ``lease_expires``, ``holder``: the token of the
  acquisition that claimed it, ``mver``: the mapping version that acquisition wrote);
* the **mapping item** M (``#map#{client}#{pool}#{key}``, region): which resource the key
  holds in that region. ``state`` is ``pending`` (an acquisition is under way: ``token`` and
  ``res`` name its claim, ``rver`` the resource version the claim was conditioned on),
  ``live`` (the claim is known to have landed) or ``free``. ``ver`` grows on every write.

The truth for "which resource does key k hold in region X" is M(k, X), read with a strongly
consistent read; never an index. A lease exists exactly when M names ``(token, resource)`` and
R is held by that same token. Writes keep M's expiry at or below R's (R is extended first),
and every free that happens before a lease's end keeps R unclaimable for a quarantine.

Every write is a :class:`rasd.core.writes.Write` (conditions as data): the daemon renders it for
DynamoDB, the protocol checker (``check/``) applies it to its model of the table.

All times are integers: microseconds since the epoch, UTC. On the table they are fixed-width
ISO-8601 strings ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` so string order is time order.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .writes import Cond, ItemKey, Value, Write, item_from_av

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
#: Partition key prefix of mapping items: ``#map#{client_id}#{pool_id}#{key}``. Mapping items
#: have no ``key``, ``pool_id``, ``partition`` or ``lease_available`` attribute: no index.
MAP_PREFIX = "#map#"
#: Mapping items are reaped by DynamoDB's TTL this long after their lease ends or is freed;
#: far longer than any request can stay in flight (a signed request is refused after minutes).
MAP_TTL_S = 24 * 3600

Item = dict[str, dict[str, Any]]  # DynamoDB low-level attribute map
Update = dict[str, Any]  # UpdateItem keyword arguments, without TableName

PENDING, LIVE, FREE = "pending", "live", "free"


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


def map_pk(client_id: str, pool_id: str, key: str) -> str:
    """Partition key of a key's mapping items (one item per region under it)."""
    return f"{MAP_PREFIX}{client_id}#{pool_id}#{key}"


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


def _s(d: dict[str, Value], name: str) -> str | None:
    v = d.get(name)
    return v if isinstance(v, str) else None


def _n(d: dict[str, Value], name: str) -> int:
    v = d.get(name)
    return v if isinstance(v, int) else 0


def resource_from(d: dict[str, Value]) -> ResourceItem:
    """A resource item from its plain-dict form (``rasd.core.writes.item_from_av``)."""
    exp = _s(d, "lease_expires")
    acq = _s(d, "lease_acquired")
    return ResourceItem(
        client_id=str(d["client_id"]),
        resource=str(d["resource"]),
        pool_id=_s(d, "pool_id") or "",
        region=_s(d, "region") or "",
        partition=_s(d, "partition") or "",
        version=_n(d, "version"),
        key=_s(d, "key"),
        lease_expires_us=parse_time(exp) if exp else None,
        lease_available=_s(d, "lease_available"),
        lease_acquired_us=parse_time(acq) if acq else None,
        holder=_s(d, "holder"),
        mver=_n(d, "mver"),
        hver=d["hver"] if isinstance(d.get("hver"), int) else None,  # type: ignore[arg-type]
        quarantine_until=_s(d, "quarantine_until"),
    )


def item_from_ddb(item: Item) -> ResourceItem:
    return resource_from(item_from_av(item))


def is_resource_item(item: Item) -> bool:
    """A resource item, not a meta or mapping item (those have a '#' client_id and no
    ``pool_id``)."""
    return not item["client_id"]["S"].startswith("#") and "pool_id" in item


def is_mapping_pk(pk: str) -> bool:
    return pk.startswith(MAP_PREFIX)


def mapping_from(d: dict[str, Value]) -> Mapping:
    """A mapping item from its plain-dict form."""
    pk = str(d["client_id"])
    if not pk.startswith(MAP_PREFIX):
        raise ValueError(f"not a mapping item: {pk!r}")
    client_id, pool_id, key = pk[len(MAP_PREFIX) :].split("#", 2)
    exp = _s(d, "exp")
    since = _s(d, "since")
    return Mapping(
        client_id=client_id,
        pool_id=pool_id,
        key=key,
        region=str(d["resource"]),
        ver=_n(d, "ver"),
        state=_s(d, "state") or FREE,
        token=_s(d, "token"),
        resource=_s(d, "res"),
        rver=_n(d, "rver"),
        expires_us=parse_time(exp) if exp else None,
        since_us=parse_time(since) if since else 0,
        owner=_s(d, "owner"),
    )


def mapping_from_ddb(item: Item) -> Mapping:
    return mapping_from(item_from_av(item))


def lease_from_item(item: ResourceItem) -> Lease:
    """The lease a held resource item stands for (jobs; tests)."""
    assert item.key is not None and item.lease_expires_us is not None
    return Lease(
        client_id=sys.intern(item.client_id),
        pool_id=sys.intern(item.pool_id),
        key=item.key,
        resource=item.resource,
        region=sys.intern(item.region),
        expires_us=item.lease_expires_us,
        version=item.version,
        acquired_us=item.lease_acquired_us or 0,
        token=item.holder,
    )


def lease_from_mapping(m: Mapping) -> Lease:
    """The lease a live (or verified pending) mapping names."""
    assert m.resource is not None and m.expires_us is not None
    # client, pool and region repeat across every cached lease: share one string each.
    return Lease(
        client_id=sys.intern(m.client_id),
        pool_id=sys.intern(m.pool_id),
        key=m.key,
        resource=m.resource,
        region=sys.intern(m.region),
        expires_us=m.expires_us,
        version=m.rver + 1,
        acquired_us=m.since_us,
        token=m.token,
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


def should_extend(lease: Lease, requested_us: int, now_us: int, fraction: float) -> bool:
    """Refresh-ahead rule for sliding ``lease_expires``.

    Extend only when the caller asks for more than the lease has AND the time left has fallen
    below ``fraction`` of the requested duration. With fraction 0.5 and a sliding "now + 1h",
    a key is written about once per half hour, not on every call. Never shortens.
    """
    if requested_us <= lease.expires_us:
        return False
    return lease.remaining_us(now_us) < fraction * (requested_us - now_us)


def pick_mapping(ms: list[Mapping]) -> Mapping | None:
    """The one mapping that stands for a key when several regions hold it (a cross-region
    race). Earliest acquisition wins, then region, then resource: the choice ``ras-dedupe``
    makes, so every daemon in every region converges on the lease that survives clean-up."""
    if not ms:
        return None
    return min(ms, key=lambda m: (m.since_us, m.region, m.resource or ""))


def pick(items: list[ResourceItem]) -> ResourceItem | None:
    """The same choice as :func:`pick_mapping`, among resource items (``ras-dedupe``)."""
    if not items:
        return None
    return min(items, key=lambda it: (it.lease_acquired_us or 0, it.region, it.resource))


# ------------------------------------------------------------------ writes: resource item
_HELD_ATTRS = ("key", "lease_expires", "lease_acquired", "holder", "mver", "hver")


def _free_until(available_us: int, now_us: int) -> tuple[str, str]:
    """The attribute an item freed now, claimable from ``available_us`` on, carries: a free
    claimable at once goes back to the available index (``lease_available``); one in
    quarantine stays out of it (``quarantine_until``) until re-listed (:func:`relist`), so
    that no agent that reads candidates from that index can see it at its current version
    (docs/design.md, "Beside the paper's agent")."""
    if available_us <= now_us:
        return ("lease_available", fmt_time(now_us))
    return ("quarantine_until", fmt_time(available_us))


def claim(
    item: ResourceItem, key: str, expires_us: int, now_us: int, token: str, mver: int
) -> Write:
    """Take a free item for ``key``: the version read, free, out of quarantine, our region.
    Records the acquisition's ``token`` and the mapping version ``mver`` it wrote."""
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("lease_available", "exists"),
            Cond("lease_available", "<=", fmt_time(now_us)),
            Cond("region", "=", item.region),
        ),
        set=(
            ("key", key),
            ("lease_expires", fmt_time(expires_us)),
            ("lease_acquired", fmt_time(now_us)),
            ("holder", token),
            ("mver", mver),
            ("hver", item.version + 1),
            ("version", item.version + 1),
        ),
        remove=("lease_available",),
        kind="claim",
    )


def fence_resource(ident: ItemKey, version: int) -> Write:
    """Bump a resource item's version if it is still ``version``: afterwards no write that was
    conditioned on ``version`` (a claim still in flight) can ever apply."""
    return Write(
        key=ident,
        conds=(Cond("version", "=", version),),
        set=(("version", version + 1),),
        kind="fence_resource",
    )


def free_claim(
    ident: ItemKey,
    key: str,
    token: str,
    now_us: int,
    available_us: int,
    expires_us: int | None = None,
) -> Write:
    """Free a claim held by ``token``: claimable again from ``available_us`` on. A claim that
    no mapping ever named (a lost acquisition's) may use ``now``; a lease that may have been
    served gets ``now + quarantine`` (see docs/design.md, I3). With ``expires_us``, only if
    the lease still ends then (``available_us`` was computed from that end)."""
    assert available_us >= now_us
    conds: tuple[Cond, ...] = (Cond("holder", "=", token), Cond("key", "=", key))
    if expires_us is not None:
        conds += (Cond("lease_expires", "=", fmt_time(expires_us)),)
    return Write(
        key=ident,
        conds=conds,
        set=(_free_until(available_us, now_us),),
        remove=_HELD_ATTRS,
        incr=("version",),
        kind="free_claim",
    )


def extend_resource(lease: Lease, expires_us: int) -> Write:
    """Push the resource's ``lease_expires`` later; only while ``lease.token`` holds it."""
    assert lease.token is not None
    return Write(
        key=(lease.client_id, lease.resource),
        conds=(
            Cond("holder", "=", lease.token),
            Cond("key", "=", lease.key),
            Cond("region", "=", lease.region),
            Cond("lease_expires", "<", fmt_time(expires_us)),
        ),
        set=(("lease_expires", fmt_time(expires_us)),),
        incr=("version", "hver"),
        kind="extend_resource",
    )


def liberate(item: ResourceItem, now_us: int) -> Write:
    """Free an expired lease (the liberator). Conditional on the version and expiry read (from
    the index, perhaps stale: the conditions are checked on the item itself), so a lease
    extended since is left alone. Claimable at once: its end has passed."""
    assert item.key is not None and item.lease_expires_us is not None
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("lease_expires", "=", fmt_time(item.lease_expires_us)),
            Cond("region", "=", item.region),
        ),
        set=(("lease_available", fmt_time(now_us)), ("version", item.version + 1)),
        remove=_HELD_ATTRS,
        kind="liberate",
    )


def free_orphan(item: ResourceItem, now_us: int, available_us: int) -> Write:
    """Free a held resource no mapping names (a crash left it), claimable again from
    ``available_us`` on: ``rasd.core.decide.orphan_free_at`` (it may have been served before the
    crash: at least the quarantine, and the lease's end when it may have been named). Until
    then it stays out of the available index (``_free_until``)."""
    assert item.holder is not None and available_us >= now_us
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version), Cond("holder", "=", item.holder)),
        set=(
            _free_until(available_us, now_us),
            ("version", item.version + 1),
        ),
        remove=_HELD_ATTRS,
        kind="free_orphan",
    )


def relist(item: ResourceItem, now_us: int) -> Write:
    """Put a quarantined item back in the available index once its quarantine is over (the
    daemon that freed it, else ``ras-liberator``): ``lease_available`` becomes the end of the
    quarantine. Conditional on the version and quarantine read, free and our region."""
    assert item.quarantine_until is not None
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("quarantine_until", "=", item.quarantine_until),
            Cond("quarantine_until", "<=", fmt_time(now_us)),
            Cond("key", "not_exists"),
            Cond("region", "=", item.region),
        ),
        set=(("lease_available", item.quarantine_until), ("version", item.version + 1)),
        remove=("quarantine_until",),
        kind="relist",
    )


def adopt(item: ResourceItem, token: str, mver: int, now_us: int) -> Write:
    """Make a lease of the paper's agent (held, no mapping names it) a rasd lease of the same
    key, to the same end: record the acquisition's ``token`` and the mapping version ``mver``
    it wrote first (``map_acquire``, rver = the version read). Conditional on the version,
    key, end and region read (strongly consistent), like a claim on the version."""
    assert item.key is not None and item.lease_expires_us is not None
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("key", "=", item.key),
            Cond("lease_expires", "=", fmt_time(item.lease_expires_us)),
            Cond("region", "=", item.region),
        ),
        set=(
            ("lease_acquired", fmt_time(now_us)),
            ("holder", token),
            ("mver", mver),
            ("hver", item.version + 1),
            ("version", item.version + 1),
        ),
        kind="adopt",
    )


def move(item: ResourceItem, to_region: str) -> Write:
    """Move a FREE item to another region (the balancer). Never touches a held item; a
    quarantined item stays quarantined (``lease_available`` is kept)."""
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("region", "=", item.region),
            Cond("lease_available", "exists"),
            Cond("key", "not_exists"),
        ),
        set=(
            ("region", to_region),
            (
                "partition",
                partition_name(
                    item.client_id, item.pool_id, to_region, partition_of(item.resource)
                ),
            ),
            ("version", item.version + 1),
        ),
        kind="move",
    )


def tombstone(item: ResourceItem, now_us: int, hold_until_us: int) -> Write:
    """Delete a resource item (``rasadmin delete-resource``/``delete-pool``), leaving a
    tombstone under its name: no attribute of either index (``key``, ``partition``,
    ``lease_available``) and no ``pool_id``, so nothing lists, claims or serves it, and
    ``hold_until``: a re-add of the name (:func:`readd`) is claimable no earlier, so a lease
    or quarantine that still runs on the name runs out first (docs/design.md, I1).
    Conditional on the version read; the version goes on growing through a re-add (claims in
    flight fail, fencing tokens keep growing). DynamoDB's TTL reaps it a day after its hold."""
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version),),
        set=(
            ("hold_until", fmt_time(hold_until_us)),
            ("deleted", fmt_time(now_us)),
            ("ttl", _ttl(hold_until_us)),
            ("version", item.version + 1),
        ),
        remove=(
            "pool_id",
            "region",
            "partition",
            "lease_available",
            "quarantine_until",
            *_HELD_ATTRS,
        ),
        kind="tombstone",
    )


def readd(
    ident: ItemKey, version: int, hold_until: str, pool_id: str, region: str, now_us: int
) -> Write:
    """Add a resource again under a tombstone's name (``rasadmin add-resources``): free,
    claimable from the later of now and the tombstone's ``hold_until`` (until then out of the
    available index, as a quarantine: ``_free_until``); only while the tombstone is still the
    one read (``version``)."""
    client_id, resource = ident
    return Write(
        key=ident,
        conds=(Cond("version", "=", version), Cond("hold_until", "exists")),
        set=(
            ("pool_id", pool_id),
            ("region", region),
            ("partition", partition_name(client_id, pool_id, region, partition_of(resource))),
            _free_until(parse_time(hold_until), now_us),
            ("version", version + 1),
        ),
        remove=("hold_until", "deleted", "ttl"),
        kind="readd",
    )


def is_tombstone(item: dict[str, Any]) -> bool:
    """A deleted resource's name (:func:`tombstone`), not a resource (either form: the
    attribute map or the plain dict)."""
    return "hold_until" in item and "pool_id" not in item


# ------------------------------------------------------------- writes: the paper's agent
def paper_claim(item: ResourceItem, key: str, expires_us: int) -> Write:
    """The paper's agent's claim (what a table keeps running beside rasd: ``bench.baseline``,
    ``rasd.steps.paper``): conditional on the version read (from the available index)
    alone; sets the key and the end, increments the version, removes ``lease_available``."""
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version),),
        set=(
            ("key", key),
            ("lease_expires", fmt_time(expires_us)),
            ("version", item.version + 1),
        ),
        remove=("lease_available",),
        kind="paper_claim",
    )


def paper_free(item: ResourceItem, now_us: int) -> Write:
    """The paper's liberator's write: conditional on the version read (from the leased
    index), clears ``key`` and ``lease_expires``, sets ``lease_available``, increments the
    version. Nothing else: attributes rasd added stay as they are."""
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version),),
        set=(("lease_available", fmt_time(now_us)), ("version", item.version + 1)),
        remove=("key", "lease_expires"),
        kind="paper_free",
    )


# ------------------------------------------------------------------- writes: mapping item
def _ver_is(ver: int) -> Cond:
    return Cond("ver", "not_exists") if ver == 0 else Cond("ver", "=", ver)


def _ttl(until_us: int) -> int:
    return until_us // US + MAP_TTL_S


def map_acquire(
    ident: ItemKey,
    expect_ver: int,
    token: str,
    resource: str,
    rver: int,
    expires_us: int,
    now_us: int,
    owner: str,
) -> Write:
    """Name our claim in the key's mapping (state ``pending``), if the mapping is still at the
    version we read (``0``: absent). One acquisition per key and region wins this write."""
    return Write(
        key=ident,
        conds=(_ver_is(expect_ver),),
        set=(
            ("state", PENDING),
            ("token", token),
            ("res", resource),
            ("rver", rver),
            ("exp", fmt_time(expires_us)),
            ("since", fmt_time(now_us)),
            ("owner", owner),
            ("ttl", _ttl(expires_us)),
            ("ver", expect_ver + 1),
        ),
        kind="map_acquire",
    )


def map_confirm(m: Mapping) -> Write:
    """``pending`` -> ``live`` once the named claim is known to have landed."""
    assert m.token is not None
    return Write(
        key=m.ident,
        conds=(Cond("ver", "=", m.ver), Cond("token", "=", m.token), Cond("state", "=", PENDING)),
        set=(("state", LIVE), ("ver", m.ver + 1)),
        kind="map_confirm",
    )


def map_extend(lease: Lease, expires_us: int) -> Write:
    """Push the mapping's ``exp`` later (after the resource's: M.exp <= R.exp always)."""
    assert lease.token is not None
    return Write(
        key=(map_pk(lease.client_id, lease.pool_id, lease.key), lease.region),
        conds=(
            Cond("token", "=", lease.token),
            Cond("res", "=", lease.resource),
            Cond("exp", "<", fmt_time(expires_us)),
        ),
        set=(("exp", fmt_time(expires_us)), ("state", LIVE), ("ttl", _ttl(expires_us))),
        incr=("ver",),
        kind="map_extend",
    )


def map_release(ident: ItemKey, token: str, now_us: int, ver: int | None = None) -> Write:
    """The key no longer holds what ``token`` claimed: mapping -> ``free``. With ``ver``,
    only if the mapping is still at that version (``ras-dedupe``: not extended since the
    end it checked was read)."""
    conds: tuple[Cond, ...] = (Cond("token", "=", token),)
    if ver is not None:
        conds += (_ver_is(ver),)
    return Write(
        key=ident,
        conds=conds,
        set=(("state", FREE), ("ttl", _ttl(now_us))),
        remove=("token", "res", "rver", "exp", "owner"),
        incr=("ver",),
        kind="map_release",
    )


def map_fence(ident: ItemKey, ver: int, now_us: int) -> Write:
    """Move a mapping past version ``ver`` (creating it, free, when ``ver`` is 0) so that no
    write conditioned on ``ver`` (an acquisition still in flight) can ever apply."""
    if ver == 0:
        return Write(
            key=ident,
            conds=(_ver_is(0),),
            set=(("state", FREE), ("ver", 1), ("ttl", _ttl(now_us))),
            kind="map_fence",
        )
    return Write(key=ident, conds=(_ver_is(ver),), set=(("ver", ver + 1),), kind="map_fence")


def map_drop_dead(m: Mapping, now_us: int) -> Write:
    """Free a pending mapping whose claim is known never to land (checked and fenced)."""
    return Write(
        key=m.ident,
        conds=(_ver_is(m.ver),),
        set=(("state", FREE), ("ver", m.ver + 1), ("ttl", _ttl(now_us))),
        remove=("token", "res", "rver", "exp", "owner"),
        kind="map_drop_dead",
    )


# -------------------------------------------------------------- read-backs (I4)
#: Does an item, read back after an ambiguous write, carry that write? (``Store.write``'s
#: ``mine``.) The driver and the protocol checker's model use these very functions.
ReadBack = Callable[[dict[str, Value]], bool]


def names_claim(token: str, resource: str) -> ReadBack:
    """The mapping names our acquisition (``map_acquire``)."""
    return lambda it: it.get("token") == token and it.get("res") == resource


def confirmed(token: str) -> ReadBack:
    """The mapping names ``token`` and is live (``map_confirm``)."""
    return lambda it: it.get("token") == token and it.get("state") == LIVE


def holds(token: str, key: str) -> ReadBack:
    """The resource is held by our acquisition (``claim``)."""
    return lambda it: it.get("holder") == token and it.get("key") == key


def not_held_by(token: str) -> ReadBack:
    """The resource is no longer held by ``token`` (``free_claim``)."""
    return lambda it: it.get("holder") != token


def no_token(token: str) -> ReadBack:
    """The mapping no longer names ``token`` (``map_release``)."""
    return lambda it: it.get("token") != token


def extended_to(token: str | None, want: str) -> ReadBack:
    """The resource is held by ``token`` until at least ``want`` (``extend_resource``)."""
    return lambda it: it.get("holder") == token and _at_least(it.get("lease_expires"), want)


def map_extended_to(token: str | None, want: str) -> ReadBack:
    """The mapping names ``token`` until at least ``want`` (``map_extend``)."""
    return lambda it: it.get("token") == token and _at_least(it.get("exp"), want)


def _at_least(v: Value | None, want: str) -> bool:
    return isinstance(v, str) and v >= want


# ------------------------------------------------------------------- pools and headroom
def miss_count_from_ddb(item: Item) -> int:
    """The count of a daemon's miss counter item (``misses#...``)."""
    return int(item.get("count", {}).get("N", "0"))


def pool_from_ddb(item: Item) -> Pool:
    """A pool definition (``#meta`` / ``pool#{client}#{pool}``, ``max_lease`` in seconds)."""
    _, client_id, pool_id = item["resource"]["S"].split("#", 2)
    return Pool(client_id, pool_id, int(float(item.get("max_lease", {"N": "0"})["N"]) * US))


HEADROOM_PREFIX = "headroom#"


def headroom_resource(client_id: str, pool_id: str, region: str) -> str:
    """Sort key of the balancer's headroom item for one (client, pool, region)."""
    return f"{HEADROOM_PREFIX}{client_id}#{pool_id}#{region}"


def headroom_item(
    client_id: str, pool_id: str, region: str, free: int, demand: int, now_us: int, horizon_s: int
) -> Item:
    """The headroom meta item the balancer writes (PutItem ``Item``)."""
    return {
        "client_id": {"S": META_CLIENT},
        "resource": {"S": headroom_resource(client_id, pool_id, region)},
        "kind": {"S": "headroom"},
        "free": {"N": str(free)},
        "projected_demand": {"N": str(demand)},
        "headroom": {"N": str(free - demand)},
        "horizon_s": {"N": str(horizon_s)},
        "updated": {"S": fmt_time(now_us)},
    }


def headroom_from_ddb(item: Item) -> tuple[int, int | None]:
    """(headroom, updated in epoch µs or None) from a headroom item. A projected shortfall
    reads as 0 spare resources, never a negative count."""
    value = max(0, int(float(item.get("headroom", {"N": "0"})["N"])))
    updated = item.get("updated", {}).get("S")
    try:
        return value, parse_time(updated) if updated else None
    except ValueError:
        return value, None


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
