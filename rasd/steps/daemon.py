"""The daemon's protocol as programs: what they share, and the daemon's own effects.

The daemon's local effects (cache, candidates, tokens, rate limit, ...), :class:`DaemonContext` and
:class:`Ops` (production runs :data:`REAL`), and the steps every program shares: reading the
key's mappings and a resource, fencing a dead acquirer's claim, waiting for a live one. The
programs of each role and how they are run: docs/design.md, "The jobs, written once".
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..core import agree as agree_rules
from ..core import builders, decide
from ..core import legacy as legacy_rules
from ..core.builders import fence_resource
from ..core.decide import Outcome, Rules
from ..core.errors import RasdError
from ..core.lease import US, Lease, Mapping, Pool, ResourceItem
from ..core.serialize import resource_from
from ..core.writes import ItemKey, Write
from . import (
    Common,
    GetItem,
    Note,
    Now,
    Program,
    QueryLeased,
    QueryMappings,
    Returns,
    Send,
    Sleep,
    Tail,
    together,
)

R = TypeVar("R")

#: (client_id, pool_id, key): a lease's place in the daemon's cache
CacheKey = tuple[str, str, str]

BACKGROUND_DEADLINE = 5.0  # extensions, confirmations, give-backs: not bound to a request
WAIT_FIRST = 0.005  # polling a pending mapping: 5 ms, doubling, up to WAIT_MAX
WAIT_MAX = 0.1
#: seconds after its quarantine's end that a daemon re-lists an item it quarantined
RELIST_SLACK = 1.0
#: a daemon re-lists what it freed only if that is due within this long (else the liberator)
RELIST_MAX_WAIT_US = 600 * US
#: attempts of a give-back (about a minute with the backoff between them)
FREE_CLAIM_ATTEMPTS = 6


# ------------------------------------------------------------------- the daemon's effects
class Candidate(Protocol):
    """A free resource the prefetcher hands out (:class:`TakeCandidate`)."""

    @property
    def item(self) -> ResourceItem: ...


@dataclass(frozen=True, slots=True)
class Deadline(Returns[None]):
    """The calls from here on must end within ``seconds`` (a background program's own
    deadline; a request's calls have the request's). Result: None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class CachePut(Returns[None]):
    """Cache ``lease``, confirmed as of monotonic time ``sent`` (``LeaseCache.put``)."""

    lease: Lease
    sent: float


@dataclass(frozen=True, slots=True)
class CacheDrop(Returns[None]):
    """Forget the cached lease of ``key`` (``LeaseCache.drop``)."""

    key: CacheKey


@dataclass(frozen=True, slots=True)
class Refresh(Returns[None]):
    """A lease was just served from the table: extend it in the background if the request
    asks for more than it has, else re-confirm it once stale (``Renewer.maybe_refresh``,
    as after a cache hit)."""

    lease: Lease
    requested_us: int


@dataclass(frozen=True, slots=True)
class RateLimit(Returns[float]):
    """Take one acquisition from the pool's token bucket. Result: 0.0, or the seconds to
    wait before one is available (nothing taken)."""

    pool: Pool


@dataclass(frozen=True, slots=True)
class NewToken(Returns[str]):
    """A fresh random lease token. Result: str."""


@dataclass(frozen=True, slots=True)
class TakeCandidate(Returns["Candidate | None"]):
    """A free resource of the pool's region to claim (the prefetcher's buffer, refilled
    from the lagging available index). Result: an object with ``.item`` (a ResourceItem),
    handed back to :class:`Untake` / :class:`LostCandidate`; or None when there is none.
    ``wait`` False: only one already in the buffer (no index read), else None."""

    pool: Pool
    wait: bool = True


@dataclass(frozen=True, slots=True)
class RefillSoon(Returns[None]):
    """Top the pool's candidate buffer up in the background, once the calls of the
    program's next round trip are answered (so that neither building the refill nor DynamoDB
    serving it delays them). Result: None."""

    pool: Pool


@dataclass(frozen=True, slots=True)
class Untake(Returns[None]):
    """The claim of ``cand`` may not have landed: it may be taken again. Result: None."""

    pool: Pool
    cand: Any = field(compare=False)


@dataclass(frozen=True, slots=True)
class LostCandidate(Returns[None]):
    """Someone else claimed ``cand`` first. Result: None."""

    pool: Pool
    cand: Any = field(compare=False)


@dataclass(frozen=True, slots=True)
class Miss(Returns["str | None"]):
    """A request found no free resource: counted for the balancer. Result: what the answer
    may add about the pool's free items that are not claimable yet (str), or None."""

    pool: Pool


@dataclass(frozen=True, slots=True)
class RelistLater(Returns[None]):
    """Start :func:`relist` for the item ``ident`` (quarantined until ``until_us``), not
    waited for on shutdown (``ras-liberator`` re-lists what is left). Result: None."""

    ident: ItemKey
    until_us: int


#: The daemon's own effects: what a daemon's driver gives meaning beyond :data:`Common`.
DaemonOwn = (
    Deadline
    | CachePut
    | CacheDrop
    | Refresh
    | RateLimit
    | NewToken
    | TakeCandidate
    | RefillSoon
    | Untake
    | LostCandidate
    | Miss
    | RelistLater
)
#: Every effect a daemon's driver performs (:data:`rasd.steps.Common` and the daemon's own).
DaemonEffect = Common | DaemonOwn
#: A daemon's program: yields :data:`DaemonEffect` and :class:`~rasd.steps.Tail` only (mypy
#: rejects any other), is sent their results (typed by ``yield from`` each effect).
DaemonProgram = Generator[DaemonEffect | Tail[Any], object, R]


# ------------------------------------------------------------------------ what they use
def _quarantine(rules: Rules, give_back: bool, pool_q_us: int) -> int:
    """Q, or a released lease's pool's own quarantine when longer (an outage budget's)."""
    return max(rules.quarantine_us, pool_q_us)


class FreeClaim(Protocol):
    """The early free's write (``rasd.core.builders.free_claim``)."""

    def __call__(
        self,
        ident: ItemKey,
        key: str,
        token: str,
        now_us: int,
        available_us: int,
        expires_us: int | None = None,
    ) -> Write: ...


@dataclass(frozen=True, eq=False)
class Ops:
    """The pure functions the programs decide and write with (:mod:`rasd.core.decide`,
    :mod:`rasd.core.builders`). Only the checker's known-bad rule sets replace one. Compared by
    identity (one instance per rule set), so a program's arguments hash fast."""

    name: str = "real"
    on_read: Callable[[Mapping | None, list[Mapping], int, Rules], decide.Decision] = field(
        default=decide.on_read, repr=False
    )
    on_resource: Callable[[Mapping, ResourceItem | None, int, Rules], decide.Decision] = field(
        default=decide.on_resource, repr=False
    )
    after_acquire: Callable[[Outcome, Outcome, int], decide.AcquireStep] = field(
        default=decide.after_acquire, repr=False
    )
    after_extend: Callable[[Outcome, Outcome | None], decide.ExtendStep] = field(
        default=decide.after_extend, repr=False
    )
    on_extend_check: Callable[[Mapping | None, Lease], decide.ExtendStep] = field(
        default=decide.on_extend_check, repr=False
    )
    after_extend_read: Callable[
        [decide.Decision, Lease, int, int, float], Lease | decide.Forget | None
    ] = field(default=decide.after_extend_read, repr=False)
    on_release_read: Callable[[Mapping | None, int, Rules], decide.Decision] = field(
        default=decide.on_release_read, repr=False
    )
    on_release_resource: Callable[[Mapping, ResourceItem | None, int, Rules], decide.Decision] = (
        field(default=decide.on_release_resource, repr=False)
    )
    #: with ``legacy_agents``: a pending mapping whose claim landed is settled, not served
    beside_legacy: Callable[
        [decide.Decision | legacy_rules.Settle], decide.Decision | legacy_rules.Settle
    ] = field(default=legacy_rules.beside_legacy, repr=False)
    #: settling: confirm our claim, or yield to the paper's lease the leased index shows
    lapsing: Callable[..., ResourceItem | None] = field(default=legacy_rules.lapsing, repr=False)
    on_settle: Callable[
        [Mapping, list[ResourceItem], int, int],
        legacy_rules.Confirm | legacy_rules.YieldTo | decide.Wait,
    ] = field(default=legacy_rules.on_settle, repr=False)
    #: with ``legacy_agents``: extend our lease past its end on the mapping, or end it
    on_lapsed: Callable[
        [Mapping, ResourceItem | None, int, int, int],
        decide.Extend | decide.Wait | legacy_rules.EndLapsed,
    ] = field(default=legacy_rules.on_lapsed, repr=False)
    #: the early free's write (``rasd.core.builders.free_claim``)
    free_claim: FreeClaim = field(default=builders.free_claim, repr=False)
    #: a strict pool's home region, where its keys' leases are agreed (None: the pool is not
    #: strict); (daemon, client_id, pool_id) -> region
    strict_home: Callable[[DaemonContext, str, str], str | None] = field(
        default=lambda d, client_id, pool_id: d.home_of(client_id, pool_id), repr=False
    )
    #: the agreement's decision (``rasd.core.agree.on_agreement``)
    on_agreement: Callable[..., agree_rules.AgreeStep] = field(
        default=agree_rules.on_agreement, repr=False
    )
    #: how long an early free stays unclaimable: (rules, a lost claim, the pool's quarantine
    #: of a released lease or 0) -> microseconds
    quarantine_us: Callable[[Rules, bool, int], int] = field(default=_quarantine, repr=False)
    #: whether an early free also waits for the lease's end: (why, legacy_agents) -> bool
    holds_to_end: Callable[[decide.Freed, bool], bool] = field(
        default=decide.holds_to_end, repr=False
    )
    #: why a claim of ours is given back, from the proof that no mapping named it
    given_back: Callable[[decide.NeverNamed | None], decide.Freed] = field(
        default=decide.given_back, repr=False
    )


REAL = Ops()


@dataclass(frozen=True)
class DaemonContext:
    """The daemon as its programs see it (values only: the checker keeps them in states)."""

    region: str
    owner: str
    rules: Rules
    #: the paper's agents share the table (adopt their leases; hold a free to a lease's end)
    legacy_agents: bool = False
    free_claim_attempts: int = FREE_CLAIM_ATTEMPTS
    ops: Ops = REAL
    #: the strict pools this daemon knows: (client_id, pool_id, home region) each
    homes: tuple[tuple[str, str, str], ...] = ()
    #: a strict pool's home region unreachable: "fail" new keys (UNAVAILABLE), or "local":
    #: answer the region's own lease unagreed, counted (``strict.fallback``)
    home_down: str = "fail"
    #: a hit's background extension reads the key's mappings first and writes nothing when
    #: another host already extended the lease far enough (``decide.after_extend_read``)
    extend_read_first: bool = True
    #: extend a sliding lease once less than this share of the asked duration is left
    extend_fraction: float = 0.5

    def home_of(self, client_id: str, pool_id: str) -> str | None:
        """A strict pool's home region; None for a normal pool, and beside the paper's agent
        (``legacy_agents``), which maps keys with no agreement (docs/global.md)."""
        if self.legacy_agents:
            return None
        for c, p, home in self.homes:
            if c == client_id and p == pool_id:
                return home
        return None


# ----------------------------------------------------------------------------- reading
def read(d: DaemonContext, pool: Pool, key: str) -> Program[tuple[Mapping | None, list[Mapping]]]:
    """The key's mappings (one strongly consistent Query): ours, and other regions'."""
    return (yield from read_key(d, pool.client_id, pool.pool_id, key))


def read_key(
    d: DaemonContext, client_id: str, pool_id: str, key: str
) -> Program[tuple[Mapping | None, list[Mapping]]]:
    """:func:`read` by the key's names."""
    ms = yield from QueryMappings(client_id, pool_id, key)
    own = next((m for m in ms if m.region == d.region), None)
    return own, [m for m in ms if m.region != d.region]


def read_first(
    d: DaemonContext, pool: Pool, key: str
) -> Program[tuple[Mapping | None, list[Mapping], list[ResourceItem]]]:
    """:func:`read`, and with ``legacy_agents`` the leased index's items of the key, read at
    once (one round trip): where a lease of the paper's agent would be."""
    if not d.legacy_agents:
        own, others = yield from read(d, pool, key)
        return own, others, []
    ms, held = yield from together(
        QueryMappings(pool.client_id, pool.pool_id, key),
        QueryLeased(pool.client_id, pool.pool_id, key),
    )
    own = next((m for m in ms if m.region == d.region), None)
    return own, [m for m in ms if m.region != d.region], list(held)


def resource(client_id: str, name: str) -> Program[ResourceItem | None]:
    got = yield from GetItem((client_id, name))
    return resource_from(got) if got is not None else None


# ------------------------------------------------------------ a round that writes nothing
def wait_for(wait: float) -> Program[float]:
    """Another daemon of this region is acquiring the key: poll again after ``wait`` (5 ms,
    doubling, up to WAIT_MAX), within the deadline. Returns the next wait."""
    yield Note("acq.waits")
    yield Sleep(wait)
    return min(wait * 2, WAIT_MAX)


def fence(r: ResourceItem) -> Program[None]:
    """Move a resource's version past the claim a dead acquirer's mapping names."""
    res = yield from Send(fence_resource(r.ident, r.version))
    yield Note("acq.fenced" if res.outcome is Outcome.APPLIED else "acq.fence_lost")
    if res.error is not None and res.outcome is not Outcome.REJECTED:
        raise res.error


def fence_or_wait(dec: decide.Decision, wait: float) -> Program[float]:
    """The round's decision is neither to serve nor to write: fence the claim a dead
    acquirer's mapping names (``FenceResource``), else wait for the live one. Returns the
    next round's wait."""
    if isinstance(dec, decide.FenceResource):
        yield from fence(dec.resource)
        return wait
    if isinstance(dec, decide.Wait) and dec.until_us is not None:
        # nothing read before then can end it: one sleep, not a read every WAIT_MAX
        wait = max(wait, (dec.until_us - (yield from Now())) / US)
    return (yield from wait_for(wait))


def error_of(*results: Any) -> RasdError | None:
    """The first error of some writes' results (None: none failed)."""
    return next((r.error for r in results if r.error is not None), None)
