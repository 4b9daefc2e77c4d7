"""The daemon's driver: what its roles share, its one task group, and the running of programs.

:meth:`Driver.run` runs one of the daemon's programs (``rasd.steps``) within a request's
deadline or in the background; :class:`Run` performs its effects: the DynamoDB calls through
the store, clocks, notes, sleeps, spawns, and the roles' own local effects through the
:class:`LocalEffects` it is given when made (docs/architecture.md, "The roles of one daemon").
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from random import Random
from typing import Any, Protocol, assert_never

import structlog

from ..config import Config
from ..core.clock import Clock
from ..core.decide import Outcome
from ..core.errors import RasdError, Timeout, Unavailable
from ..core.lease import MAP_PREFIX, META_CLIENT, Lease, Pool
from ..core.rollout import (
    Rollout,
    paper_lease,
    raise_signal,
)
from ..core.serialize import resource_from
from ..core.writes import Value
from ..dynamo.store import Store
from ..limits import BucketTable
from ..observe.metrics import Counters
from ..steps import (
    At,
    Delete,
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    Put,
    QueryAvailable,
    QueryLeased,
    QueryMappings,
    R,
    Send,
    Sleep,
    Spawn,
    Together,
    drive,
)
from ..steps import daemon as daemon_steps
from .cache import CacheKey
from .prefetch import Prefetcher
from .tasks import Tasks

log = structlog.get_logger("rasd.daemon.driver")


#: the strict pools known, (client_id, pool_id, home) each
Homes = tuple[tuple[str, str, str], ...]


class StrictPools:
    """The strict pools known (``Pool.home``): the pool table updates it as it reads the
    pools, the driver's programs read it (their ``DaemonContext.homes``)."""

    __slots__ = ("homes",)

    def __init__(self) -> None:
        self.homes: Homes = ()

    def update(self, homes: Homes) -> None:
        self.homes = homes


class RolloutMode:
    """Whether this daemon's programs keep the rules beside the paper's agent: the table's
    rollout record (``rasd.core.rollout``, read with the pools at start-up and every
    ``pool_refresh``), or ``legacy_agents`` forcing it on. A lease of the paper's agent seen
    while the record says none turns it on again (:meth:`Driver.paper_lease_seen`)."""

    __slots__ = ("forced", "raising", "record")

    def __init__(self, forced: bool) -> None:
        self.forced = forced
        self.record = Rollout()
        self.raising = False

    @property
    def on(self) -> bool:
        return self.forced or self.record.paper_agents

    def update(self, record: Rollout) -> None:
        was = self.on
        self.record = record
        if self.on != was:
            log.warning(
                "rollout_mode",
                on=self.on,
                changed=record.changed,
                by=record.by,
                why=record.why,
            )


class LocalEffects(Protocol):
    """The local effects the roles perform, one function each. The driver runs the roles'
    programs and the roles perform these of its effects, so the driver is given the object
    that binds them (the coordinator) when made, and calls them only once the roles exist."""

    #: ``Refresh``: a lease was just served from the table (``Renewer.refresh``)
    refresh: Callable[[daemon_steps.Refresh], None]
    #: ``CachePut``: the lease and when its confirmation was sent (``LeaseCache.put``)
    cache_put: Callable[[Lease, float], None]
    #: ``CacheDrop`` (``LeaseCache.drop``)
    cache_drop: Callable[[CacheKey], None]
    #: ``Miss``: what the answer may add about the pool (``Reporter.miss``)
    miss: Callable[[daemon_steps.Miss], str | None]
    #: ``RelistLater`` (``Releaser.relist_later``)
    relist_later: Callable[[daemon_steps.RelistLater], None]


class Driver:
    """What the daemon's roles share, and the running of their programs."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        clock: Clock,
        counters: Counters,
        rng: Random,
        rollout: RolloutMode,
        local: LocalEffects,
        prefetch: Prefetcher,
        strict: StrictPools | None = None,
        owner: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.rules = cfg.rules()
        self.region = cfg.region
        self.store = store
        self.clock = clock
        self.counters = counters
        self.rng = rng
        self.prefetch = prefetch
        # drawn even when ``owner`` is given: the rng's later draws are the same either way
        named = f"{socket.gethostname()}:{os.getpid()}:{rng.getrandbits(32):08x}"
        #: this daemon's name in the items it writes (tests give one)
        self.owner = owner or named
        self.buckets: BucketTable[tuple[str, str]] = BucketTable(cfg.rate_limit, cfg.rate_burst)
        self.tasks = Tasks(self.counters)
        #: the table's rollout record, shared with the pool table that reads it
        self.rollout = rollout
        #: the local effects the roles perform
        self.local = local
        #: the strict pools known (the pool table updates it)
        self.strict = strict or StrictPools()
        #: other regions' replicas this daemon has written to (a strict pool's home)
        self.peers: dict[str, Store] = {}
        self._peer_lock = asyncio.Lock()

    def steps_daemon(self) -> daemon_steps.DaemonContext:
        """This daemon as its programs see it (read at each program's start: the rollout
        mode and the strict pools change)."""
        return daemon_steps.DaemonContext(
            self.region,
            self.owner,
            self.rules,
            self.rollout.on,
            homes=self.strict.homes,
            home_down=self.cfg.strict_home_down,
            extend_read_first=self.cfg.extend_read_first,
            extend_fraction=self.cfg.extend_fraction,
        )

    def set_rates(self, rate: float, burst: float) -> None:
        """New per-pool rate limits (a reload): each pool's bucket starts again, full."""
        self.buckets = BucketTable(rate, burst)

    async def peer(self, region: str) -> Store:
        """The store of ``region``'s replica (a strict pool's home): ours for our region,
        else opened at first use, at ``peer_endpoints[region]`` or where botocore resolves
        it."""
        if region == self.region:
            return self.store
        store = self.peers.get(region)
        if store is not None:
            return store
        async with self._peer_lock:
            store = self.peers.get(region)
            if store is None:
                cfg = replace(self.cfg, endpoint_url=self.cfg.peer_endpoints.get(region))
                store = Store(cfg, self.counters, region=region)
                try:
                    await store.start()
                except Exception as exc:  # AWS settings refused, endpoint unresolvable
                    raise Unavailable(f"region {region}'s replica: {exc}") from exc
                self.peers[region] = store
        return store

    async def close_peers(self) -> None:
        peers, self.peers = list(self.peers.values()), {}
        for store in peers:
            await store.close()

    async def run(
        self,
        fn: Callable[..., daemon_steps.DaemonProgram[R]],
        *args: Any,
        deadline: float | None = None,
    ) -> R:
        """Run the program ``fn(daemon, *args)``, ``daemon`` this daemon as its programs see
        it: its calls end by the request's ``deadline`` (None: a background program's own)."""
        prog = fn(self.steps_daemon(), *args)
        if deadline is None:
            return await self.run_bg(prog)
        return await drive(prog, Run(self, deadline).perform)

    async def run_bg(self, prog: daemon_steps.DaemonProgram[R]) -> R:
        """Run a background program: its own deadline, not bound to a request."""
        return await drive(
            prog, Run(self, time.monotonic() + daemon_steps.BACKGROUND_DEADLINE).perform
        )

    def new_token(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    def paper_lease_seen(self, item: dict[str, Value]) -> None:
        """A resource item read holds a lease of the paper's agent while the table's record
        says no such agent writes it: say so, count it, and turn rollout mode on (here at
        once; in the table by the signal, which every daemon and job reads with the record)."""
        self.counters.inc("rollout.paper_lease_seen")
        log.error(
            "paper_lease_outside_rollout",
            resource=item.get("resource"),
            key=item.get("key"),
            hint="the paper's agent writes this table: rollout mode turned on",
        )
        if self.rollout.raising:
            return
        self.rollout.raising = True
        self.rollout.update(replace(self.rollout.record, paper_agents=True))
        self.tasks.spawn(self._raise_rollout(str(item.get("resource"))))

    async def _raise_rollout(self, resource: str) -> None:
        deadline = time.monotonic() + daemon_steps.BACKGROUND_DEADLINE
        try:
            for _ in range(3):
                seen = await self.store.read_rollout(deadline)
                if seen.paper_agents:
                    self.rollout.update(seen)
                    return
                w = raise_signal(
                    seen, self.clock.now_us(), self.owner, f"paper lease on {resource}"
                )
                res = await self.store.write(w, deadline)
                if res.outcome is Outcome.APPLIED:
                    self.counters.inc("rollout.raised")
                    return
                if res.outcome is Outcome.UNKNOWN:
                    break
        except RasdError as exc:
            log.warning("rollout_raise_failed", error=str(exc))
        finally:
            self.rollout.raising = False


class Run:
    """One program's run in this daemon: performs its effects (``rasd.steps`` and
    ``rasd.steps.daemon``) with its deadline (monotonic seconds)."""

    __slots__ = ("deadline", "drv", "refill")

    def __init__(self, drv: Driver, deadline: float) -> None:
        self.drv = drv
        self.deadline = deadline
        #: RefillSoon: once the next round trip's calls are answered (sent beside them, the
        #: refill's index page would be served among them, and delay the claim's answer)
        self.refill: Pool | None = None

    async def perform(self, eff: daemon_steps.DaemonEffect) -> Any:
        """Perform one effect; ``match`` over every effect a daemon's program may yield, so
        an effect added without a handler here fails mypy (``assert_never``). Ordered by how
        often each comes (a new lease's calls first)."""
        drv = self.drv
        match eff:
            case QueryMappings():
                return await drv.store.query_mappings(
                    eff.client_id, eff.pool_id, eff.key, self.deadline
                )
            case GetItem():
                got = await drv.store.get_item(eff.key, self.deadline)
                if (
                    got is not None
                    and "key" in got
                    and not drv.rollout.on
                    and eff.key[0] != META_CLIENT
                    and not eff.key[0].startswith(MAP_PREFIX)
                    and paper_lease(resource_from(got))
                ):
                    drv.paper_lease_seen(got)
                return got
            case Send():
                refill, self.refill = self.refill, None
                try:
                    return await drv.store.write(eff.write, self.deadline, eff.readback)
                finally:
                    if refill is not None:
                        drv.prefetch.refill_soon(refill)
            case Now():
                return drv.clock.now_us()
            case Mono():
                return drv.clock.mono()
            case Note():
                if eff.level:
                    getattr(log, eff.level)(eff.event, **dict(eff.fields))
                else:
                    drv.counters.inc(eff.event)
                return None
            case daemon_steps.CachePut():
                drv.local.cache_put(eff.lease, eff.sent)
                return None
            case daemon_steps.CacheDrop():
                drv.local.cache_drop(eff.key)
                return None
            case Together():
                # every call sent at once (one round trip); a failed read fails the effect;
                # a refill due waits for all of them
                refill, self.refill = self.refill, None
                results = await asyncio.gather(
                    *(self.perform(c) for c in eff.calls), return_exceptions=True
                )
                if refill is not None:
                    drv.prefetch.refill_soon(refill)
                for r in results:
                    if isinstance(r, BaseException):
                        raise r
                return tuple(results)
            case Spawn():
                return drv.tasks.spawn(drv.run_bg(eff.fn(*eff.args)))
            case daemon_steps.TakeCandidate():
                if not eff.wait:
                    return drv.prefetch.at_hand(eff.pool)
                return await drv.prefetch.candidate(eff.pool, self.deadline)
            case daemon_steps.RefillSoon():
                self.refill = eff.pool
                return None
            case daemon_steps.Untake():
                drv.prefetch.untake(eff.pool, eff.cand)
                return None
            case daemon_steps.LostCandidate():
                drv.prefetch.lost(eff.pool, eff.cand)
                return None
            case daemon_steps.RateLimit():
                return drv.buckets.try_take(
                    (eff.pool.client_id, eff.pool.pool_id), drv.clock.mono()
                )
            case daemon_steps.NewToken():
                return drv.new_token()
            case Sleep():
                if eff.bounded and time.monotonic() + eff.seconds >= self.deadline:
                    raise Timeout("another daemon is acquiring this key; deadline passed")
                await asyncio.sleep(eff.seconds)
                return None
            case daemon_steps.Deadline():
                self.deadline = time.monotonic() + eff.seconds
                return None
            case Join():
                left = self.deadline - time.monotonic()
                if left > 0:
                    await asyncio.wait({eff.handle}, timeout=left)
                return None
            case QueryLeased():
                return await drv.store.query_leased(
                    eff.client_id, eff.pool_id, eff.key, self.deadline
                )
            case daemon_steps.Refresh():
                return drv.local.refresh(eff)
            case daemon_steps.Miss():
                return drv.local.miss(eff)
            case daemon_steps.RelistLater():
                return drv.local.relist_later(eff)
            case At(call=GetItem() as get):
                peer = await drv.peer(eff.region)
                return await peer.get_item(get.key, self.deadline)
            case At(call=Send() as sent):
                peer = await drv.peer(eff.region)
                return await peer.write(sent.write, self.deadline, sent.readback)
            case QueryAvailable() | At() | Put() | Delete():
                raise TypeError(f"a daemon's program yielded a job's effect: {eff!r}")
            case _:
                assert_never(eff)
