"""The daemon's lease cache (:class:`LeaseCache`). Only a cache: DynamoDB is the truth, a
restart starts empty.

An entry is served until S after its confirmation and never within ``skew_margin`` of the
lease's end (docs/design.md, I3); a pool with an outage budget keeps spare entries for the
router's fallback ("An outage budget"). Entries are compact bytes, each with its hit's
answer frame: docs/design.md, "The lease cache".
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import msgpack
from cachetools import TTLCache

from rasd_client.wire import HEADER_SIZE

from ..core import cache_rules
from ..core.clock import Clock
from ..core.decide import Rules, check_expiry
from ..core.errors import BadRequest
from ..core.lease import US, Lease, Pool
from ..wire import ID_PACK, answer_head, answer_wide
from .published import Published, Table

CacheKey = tuple[str, str, str]  # (client_id, pool_id, key)
#: see the module docstring
Entry = bytes
#: what LeaseCache.read gives: the entry, its confirmation time, extend_from_us, head_end
Read = tuple[Entry, float, int, int]
_Pool = dict[str, Entry]

META = struct.Struct("<dddqH")
_UNPACK = META.unpack_from
HEAD = META.size  # where the answer's head starts in an entry
NEVER = cache_rules.NEVER  # extend_from_us of a lease this daemon never extends
#: seconds between two reads of the wall clock on the hit path (LeaseCache.wall_us)
WALL_RESYNC = 0.25
#: leases' ends remembered past their entries (``LeaseCache.ends``): how many, how long (s)
ENDS_KEYS, ENDS_S = 20_000, 600.0
#: what a hit that calls for background work asks (``Renewer.maybe_refresh``): the key, the
#: cached Lease, the requested end, the wall time (us)
Refresh = Callable[[CacheKey, Lease, int, int], None]


def _no_refresh(k: CacheKey, lease: Lease, requested_us: int, now_us: int) -> None:
    """A cache made without a renewer (tests): a hit asks for nothing."""


def pack_entry(
    lease: Lease, confirmed: float, until: float, region: str, spare: float | None = None
) -> Entry:
    head = answer_head(lease)
    ext = cache_rules.extend_from(lease, region)
    tail: bytes = msgpack.packb((lease.acquired_us, lease.token))
    spare = until if spare is None else max(until, spare)
    return META.pack(until, spare, confirmed, ext, HEAD + len(head)) + head + tail


def lease_of(client_id: str, pool_id: str, key: str, e: Entry) -> Lease:
    """The Lease an entry was made from."""
    end = META.unpack_from(e)[4]
    ans = msgpack.unpackb(e[HEAD + HEADER_SIZE : end] + bytes(8))
    acquired_us, token = msgpack.unpackb(e[end:])
    return Lease(
        client_id,
        pool_id,
        key,
        ans["resource"],
        ans["region"],
        ans["lease_expires_us"],
        ans["version"],
        acquired_us,
        token,
    )


def until_of(e: Entry) -> float:
    until: float = META.unpack_from(e)[0]
    return until


def _frame(e: Entry, end: int, req_id: int) -> bytes:
    """The answer frame of entry ``e`` (``head_end`` ``end``) for request ``req_id``."""
    try:
        return e[HEAD:end] + ID_PACK(req_id)
    except struct.error:  # a negative id: no uint64
        return answer_wide(e[HEAD:end], req_id)


class LeaseCache:
    __slots__ = (
        "_half_s",
        "_n",
        "_wall_offset_us",
        "_wall_synced",
        "clock",
        "confirm_s",
        "dropped",
        "ends",
        "entries",
        "maxsize",
        "pools",
        "published",
        "refresh",
        "refreshing",
        "region",
        "rules",
        "skew_margin_us",
    )

    def __init__(
        self,
        clock: Clock,
        maxsize: int,
        skew_margin_us: int,
        confirm_s: float,
        region: str = "",
        *,
        pools: dict[tuple[str, str], Pool] | None = None,
        refreshing: set[CacheKey] | None = None,
        refresh: Refresh = _no_refresh,
        rules: Rules | None = None,
        published: Published | None = None,
    ) -> None:
        self.clock = clock
        #: the tables every answer this cache may give is written to (None: no tables)
        self.published = published
        #: when each key was last dropped (monotonic), for S: a put confirmed before it is
        #: older news than the drop (a read sent before a release was written)
        self.dropped: dict[CacheKey, float] = {}
        #: the end of the lease last put for each key, kept past its entry: the keys this
        #: host knew lately (rollout mode's hint, ``Acquirer``)
        self.ends: TTLCache[CacheKey, int] = TTLCache(ENDS_KEYS, ENDS_S, clock.mono)
        #: the protocol's bounds, for a pool's outage window (None: no pool gets one)
        self.rules = rules
        self.maxsize = maxsize
        self.skew_margin_us = skew_margin_us
        self.confirm_s = confirm_s
        self._half_s = confirm_s / 2
        #: leases of this region may be extended by this daemon (``extend_from_us``)
        self.region = region
        #: client_id -> pool_id -> key -> entry (the server's hot path reads it directly)
        self.entries: dict[str, dict[str, _Pool]] = {}
        self._n = 0  # entries held, expired ones included until they are dropped
        # What the hit reads besides the entries: see the module docstring, "The cached hit".
        #: (client_id, pool_id) -> Pool: the pool table's dict, read in place
        self.pools: dict[tuple[str, str], Pool] = {} if pools is None else pools
        #: keys with a refresh under way (the renewer's set)
        self.refreshing: set[CacheKey] = set() if refreshing is None else refreshing
        #: the background work a hit calls for (``Renewer.maybe_refresh``)
        self.refresh: Refresh = refresh
        self._wall_synced = -math.inf
        self._wall_offset_us = 0

    # ------------------------------------------------------------------------- hot path
    def wall_us(self, mono: float) -> int:
        """Wall time (microseconds) at monotonic time ``mono``, from an offset read again
        once WALL_RESYNC has passed. Only for checks that tolerate a fraction of a second
        (the requested lease end, when to extend); validity runs on the monotonic clock
        alone (docs/design.md, I3)."""
        if not 0 <= mono - self._wall_synced < WALL_RESYNC:
            self._wall_synced = mono
            self._wall_offset_us = self.clock.now_us() - int(mono * US)
        return int(mono * US) + self._wall_offset_us

    def answer(
        self,
        client_id: str,
        pool_id: str,
        key: str,
        requested_us: int,
        now: float,
        req_id: int,
    ) -> bytes | None:
        """What the cache answers a well-formed get_lease at monotonic time ``now``: the whole
        answer frame for request ``req_id``, or None when this is no hit (an unknown pool, no
        valid entry); raises BadRequest, naming it, when a known pool refuses the lease end.
        Starts the background work a hit calls for: a re-confirmation past S/2, an extension
        when the caller asks for more than the lease has (``refresh``); the Lease is rebuilt
        only then. Otherwise allocates only the answer. Never awaits. The entry is read by
        :meth:`read`, the one reader of the cache (inlining it measured no faster;
        docs/history/performance-history.md)."""
        pool = self.pools.get((client_id, pool_id))
        if pool is None:
            return None
        if 0 <= now - self._wall_synced < WALL_RESYNC:
            now_us = int(now * US) + self._wall_offset_us
        else:
            now_us = self.wall_us(now)
        if not 0 < requested_us - now_us <= pool.max_lease_us:  # check_expiry, inlined
            raise BadRequest(check_expiry(requested_us, now_us, pool.max_lease_us) or "")
        r = self.read(client_id, pool_id, key, now)
        if r is None:
            return None
        e, confirmed, extend_from_us, end = r
        # cache_rules.hit_wants_refresh, inlined (a call costs 2 % of a hit; a test holds them
        # equal)
        if now - confirmed > self._half_s or requested_us > extend_from_us:
            k = (client_id, pool_id, key)
            if k not in self.refreshing:
                self.refresh(k, lease_of(client_id, pool_id, key, e), requested_us, now_us)
        try:  # _frame, inlined: every hit answers here
            return e[HEAD:end] + ID_PACK(req_id)
        except struct.error:  # a negative id: no uint64
            return answer_wide(e[HEAD:end], req_id)

    def read(self, client_id: str, pool_id: str, key: str, now: float) -> Read | None:
        """The entry valid at monotonic time ``now`` with its META (confirmation time,
        extend_from_us, head_end), or None; an entry past its validity is dropped. The one
        reader of the cache (:meth:`answer` included)."""
        pools = self.entries.get(client_id)
        if pools is None:
            return None
        d = pools.get(pool_id)
        if d is None:
            return None
        e = d.get(key)
        if e is None:
            return None
        until, spare, confirmed, extend_from_us, end = _UNPACK(e)
        if now < until:  # cache_rules.serves, inlined: every hit reads here
            return e, confirmed, extend_from_us, end
        if now >= spare:  # past the pool's outage window too (:meth:`spare_entry`)
            del d[key]
            self._n -= 1
            if self.published is not None:
                self.published.drop(client_id, pool_id, key)
        return None

    def spare_answer(
        self, client_id: str, pool_id: str, key: str, requested_us: int, now: float, req_id: int
    ) -> bytes | None:
        """The answer frame of an entry past S but inside its pool's outage window, for a
        daemon that cannot reach DynamoDB (``Router``); None when there is none. Asks for the
        background work a hit past S/2 asks for, which tells when DynamoDB is back."""
        e = self.spare_entry(client_id, pool_id, key, now)
        if e is None:
            return None
        k = (client_id, pool_id, key)
        if k not in self.refreshing:
            self.refresh(k, lease_of(client_id, pool_id, key, e), requested_us, self.wall_us(now))
        return _frame(e, _UNPACK(e)[4], req_id)

    def spare_entry(self, client_id: str, pool_id: str, key: str, now: float) -> Entry | None:
        """The entry past S (:meth:`read` no longer serves it) whose pool's outage window
        still runs at monotonic time ``now``; None otherwise."""
        if (client_id, pool_id) not in self.pools:
            return None  # a pool deleted since: nothing of it is served
        e = self.entries.get(client_id, {}).get(pool_id, {}).get(key)
        if e is None:
            return None
        until, spare = _UNPACK(e)[:2]
        return e if until <= now < spare else None

    def restore(self, client_id: str, pool_id: str, key: str, e: Entry) -> None:
        """Put back an entry taken out for a request that then could not reach DynamoDB
        (``Router``), unless another took its place meanwhile."""
        d = self._pool_for(client_id, pool_id)
        if key not in d:
            d[key] = e
            self._n += 1

    def take(self, client_id: str, pool_id: str, key: str) -> Entry | None:
        """Remove and return the key's entry (a request goes to DynamoDB for it)."""
        e = self.entries.get(client_id, {}).get(pool_id, {}).pop(key, None)
        if e is not None:
            self._n -= 1
            if self.published is not None:
                self.published.drop(client_id, pool_id, key)
        return e

    def entry(self, client_id: str, pool_id: str, key: str, now: float) -> Entry | None:
        """The entry valid at monotonic time ``now``, or None (:meth:`read`)."""
        r = self.read(client_id, pool_id, key, now)
        return None if r is None else r[0]

    # ---------------------------------------------------------------------- by CacheKey
    def get(self, k: CacheKey, now: float | None = None) -> Lease | None:
        e = self.entry(k[0], k[1], k[2], self.clock.mono() if now is None else now)
        return lease_of(k[0], k[1], k[2], e) if e is not None else None

    def confirmed_at(self, k: CacheKey) -> float | None:
        e = self.entry(k[0], k[1], k[2], self.clock.mono())
        if e is None:
            return None
        confirmed: float = META.unpack_from(e)[2]
        return confirmed

    def stale(self, k: CacheKey, now: float) -> bool:
        """Past half of S since the last confirmation: re-confirm in the background."""
        e = self.entry(k[0], k[1], k[2], now)
        return e is not None and cache_rules.stale(META.unpack_from(e)[2], now, self.confirm_s)

    def put(self, lease: Lease, confirmed: float) -> None:
        """Store a lease confirmed at monotonic time ``confirmed`` (when the read or write that
        confirmed it was sent). An older confirmation never replaces a newer one, nor a
        drop made after it (:meth:`drop`); an entry already past its validity is simply not
        kept."""
        now = self.clock.mono()
        dropped = self.dropped.get((lease.client_id, lease.pool_id, lease.key))
        if dropped is not None and confirmed < dropped:
            return
        self.ends[(lease.client_id, lease.pool_id, lease.key)] = lease.expires_us
        d = self._pool_for(lease.client_id, lease.pool_id)
        key = lease.key
        current = d.get(key)
        if current is not None:
            cur_until, _, cur_confirmed = META.unpack_from(current)[:3]
            if cache_rules.keeps_current(cur_confirmed, cur_until, confirmed, now):
                return
        now_us = self.clock.now_us()
        until = cache_rules.valid_until(
            confirmed, self.confirm_s, now, lease.expires_us, self.skew_margin_us, now_us
        )
        spare = until
        pool = self.pools.get((lease.client_id, lease.pool_id))
        if pool is not None and pool.outage_budget_us and self.rules is not None:
            window = cache_rules.outage_window_us(self.rules, pool) / US
            spare = cache_rules.valid_until(
                confirmed, window, now, lease.expires_us, self.skew_margin_us, now_us
            )
        if current is not None:
            del d[key]  # re-inserted at the end: eviction goes oldest confirmation first
            self._n -= 1
        if not cache_rules.serves(spare, now):
            if current is not None:
                self._unpublish(lease.client_id, lease.pool_id, key)
            return
        if self._n >= self.maxsize:
            self._make_room(now)
            d = self._pool_for(lease.client_id, lease.pool_id)  # purge drops empty pools
        d[key] = e = pack_entry(lease, confirmed, until, self.region, spare)
        self._n += 1
        if self.published is not None:
            self._publish(lease.client_id, lease.pool_id, key, e, now, lease)

    # ------------------------------------------------------------------------- tables
    def open_table(self, client_id: str) -> Table | None:
        """The client's table (``rasd.daemon.published``), made with every answer this
        cache now gives for the client if it is new; None when there are no tables."""
        published = self.published
        if published is None:
            return None
        t = published.get(client_id)
        if t is None:
            t = published.make(client_id)
            now = self.clock.mono()
            for pool_id, d in self.entries.get(client_id, {}).items():
                for key, e in d.items():
                    self._publish(client_id, pool_id, key, e, now)
        return t

    def _publish(
        self,
        client_id: str,
        pool_id: str,
        key: str,
        e: Entry,
        now: float,
        lease: Lease | None = None,
    ) -> None:
        """Write entry ``e`` into its client's table, if that has one: served there as
        :meth:`answer` would serve it, never past ``until``, with the pool's longest lease."""
        assert self.published is not None
        t = self.published.get(client_id)
        if t is None:
            return
        until, _, confirmed, ext, _ = _UNPACK(e)
        pool = self.pools.get((client_id, pool_id))
        if pool is None or not cache_rules.serves(until, now):
            t.remove(pool_id, key)
            return
        if lease is None:
            lease = lease_of(client_id, pool_id, key, e)
        t.put(pool_id, key, until, confirmed + self._half_s, ext, pool.max_lease_us, lease)

    def _unpublish(self, client_id: str, pool_id: str, key: str) -> None:
        if self.published is not None:
            self.published.drop(client_id, pool_id, key)

    def _pool_for(self, client_id: str, pool_id: str) -> _Pool:
        pools = self.entries.get(client_id)
        if pools is None:
            pools = self.entries[client_id] = {}
        d = pools.get(pool_id)
        if d is None:
            d = pools[pool_id] = {}
        return d

    def drop(self, k: CacheKey) -> None:
        """Drop the key's entry (a release, a lease found lost or changed): from now on no put
        confirmed before this time is kept (for S; past it such a put is past S anyway).
        Kept in the order of the drops, so the oldest go first, as many as the cache."""
        now = self.clock.mono()
        dropped = self.dropped
        dropped.pop(k, None)
        dropped[k] = now
        while True:
            first = next(iter(dropped))
            if now - dropped[first] <= self.confirm_s and len(dropped) <= self.maxsize:
                break
            del dropped[first]
        d = self.entries.get(k[0], {}).get(k[1])
        if d is not None and d.pop(k[2], None) is not None:
            self._n -= 1
            self._unpublish(*k)

    # ------------------------------------------------------------------------- upkeep
    def purge(self, now: float) -> int:
        """Drop every entry past its validity; returns how many are left."""
        n = 0
        unpack = META.unpack_from
        for cid, pools in self.entries.items():
            for pid, d in list(pools.items()):
                dead = [k for k, e in d.items() if unpack(e)[1] <= now]
                for k in dead:
                    del d[k]
                    self._unpublish(cid, pid, k)
                n += len(d)
                if not d:
                    del pools[pid]
        self._n = n
        return n

    def _make_room(self, now: float) -> None:
        if self.purge(now) < self.maxsize:
            return
        for cid, pools in self.entries.items():
            for pid, d in pools.items():
                drop = max(1, len(d) // 8)
                for k in [k for k, _ in zip(d, range(drop), strict=False)]:
                    del d[k]
                    self._n -= 1
                    self._unpublish(cid, pid, k)

    def size(self) -> int:
        """Entries held, expired ones not yet dropped included (cheap: for gauges)."""
        return self._n

    def __len__(self) -> int:
        return self.purge(self.clock.mono())

    def __contains__(self, k: CacheKey) -> bool:
        return self.get(k) is not None
