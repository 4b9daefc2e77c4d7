"""What to do with what was read: the acquisition protocol's decisions. Pure: no I/O.

Theory of operation
-------------------
A daemon resolving ``get_lease(k)`` or ``release(k)`` reads, decides, writes, and reads again
until a decision ends the request. Every decision is a function here, with time passed in;
``rasd.acquire`` is the driver that does the I/O a decision asks for, and the protocol checker
(``check/``) drives the same functions against a model of DynamoDB. The invariants these
rules keep, and why, are in docs/design.md ("Invariants").

The steps:

1. :func:`on_read` (after one strongly consistent Query of the key's mapping items, one per
   region): serve a live lease, extend one that is about to end, verify a pending one against
   its resource item, or acquire.
2. :func:`on_resource` (a pending mapping and its resource item, read consistently): the claim
   landed (serve and confirm), is young (wait), may still land (fence it), or never will
   (take the mapping over).
3. :func:`after_acquire` (the mapping write and the claim, sent together): won, try the next
   candidate, give back a claim no mapping names, re-read, or give up without guessing.
4. :func:`after_extend` and :func:`on_release_read` for sliding leases and early release.

An outcome of a write is ``APPLIED``, ``REJECTED`` (its condition failed: definitive) or
``UNKNOWN`` (timeout, lost reply, 5xx not resolved by a read-back): nothing is ever decided
from an unknown outcome except to stop and leave the state for a reader to resolve (I4).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from .lease import (
    FREE,
    LIVE,
    PENDING,
    Lease,
    Mapping,
    ResourceItem,
    lease_from_mapping,
    parse_time,
    pick,
)


class Outcome(enum.Enum):
    APPLIED = "applied"
    REJECTED = "rejected"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Rules:
    """The protocol's time bounds, in microseconds (derived from Config in one place)."""

    #: a lease is served only while more than this is left (clock skew between hosts)
    margin_us: int
    #: the liberator frees a lease only this long after its end (>= the clock-skew bound)
    grace_us: int
    #: a pending mapping younger than this is left to its acquirer (readers wait)
    pending_hold_us: int
    #: early frees keep a resource unclaimable this long (>= confirm + skew + replication lag)
    quarantine_us: int
    #: a cached answer is served at most this long after it was last confirmed (S)
    confirm_us: int


# ------------------------------------------------------------------------- decisions
@dataclass(frozen=True, slots=True)
class Serve:
    lease: Lease
    #: a pending mapping just verified: write it ``live`` in the background
    confirm: Mapping | None = None
    #: another region's lease: served as it is, never written by this daemon
    foreign: bool = False


@dataclass(frozen=True, slots=True)
class Extend:
    """Our region's lease is too close to its end to serve: extend it first (R, then M)."""

    mapping: Mapping


@dataclass(frozen=True, slots=True)
class Verify:
    """A pending mapping: read its resource item (strongly consistent) and ask on_resource."""

    mapping: Mapping


@dataclass(frozen=True, slots=True)
class Acquire:
    """No lease in our region: claim a candidate and write the mapping at ``expect_ver``."""

    expect_ver: int


@dataclass(frozen=True, slots=True)
class Wait:
    why: str


@dataclass(frozen=True, slots=True)
class FenceResource:
    """A pending claim may still land: bump the resource's version so it never does."""

    resource: ResourceItem


@dataclass(frozen=True, slots=True)
class DropMapping:
    """A pending mapping whose claim never landed: free it (conditional on its version)."""

    mapping: Mapping


@dataclass(frozen=True, slots=True)
class NotHeld:
    why: str


@dataclass(frozen=True, slots=True)
class ReleaseLease:
    """Free a lease: the mapping first, then the resource with quarantine."""

    lease: Lease


Decision = (
    Serve | Extend | Verify | Acquire | Wait | FenceResource | DropMapping | NotHeld | ReleaseLease
)


# ---------------------------------------------------------------------------- reading
def servable(m: Mapping, now_us: int, rules: Rules) -> bool:
    """A live mapping whose lease has more than the margin left."""
    return m.state == LIVE and m.expires_us is not None and m.expires_us - rules.margin_us > now_us


def on_read(own: Mapping | None, others: list[Mapping], now_us: int, rules: Rules) -> Decision:
    """After a consistent read of the key's mappings: ``own`` is our region's, ``others`` are
    other regions' (replicated copies: a little stale, used only to avoid a cross-region
    duplicate, never written)."""
    foreign = [m for m in others if servable(m, now_us, rules)]
    best_foreign = min(foreign, key=_order) if foreign else None
    if own is not None and own.state == LIVE and own.expires_us is not None:
        if servable(own, now_us, rules):
            if best_foreign is not None and _order(best_foreign) < _order(own):
                return Serve(lease_from_mapping(best_foreign), foreign=True)
            return Serve(lease_from_mapping(own))
        if now_us < own.expires_us + rules.grace_us:
            # Still ours (the liberator waits for the grace), just too close to its end.
            return Extend(own)
        # Lapsed: a new acquisition (the old resource is the liberator's).
    if own is not None and own.state == PENDING:
        if best_foreign is not None:
            return Serve(lease_from_mapping(best_foreign), foreign=True)
        return Verify(own)
    if best_foreign is not None:
        return Serve(lease_from_mapping(best_foreign), foreign=True)
    return Acquire(own.ver if own is not None else 0)


def _order(m: Mapping) -> tuple[int, str, str]:
    return (m.since_us, m.region, m.resource or "")


def claim_landed(m: Mapping, r: ResourceItem | None) -> bool:
    """Does the resource item carry the claim the mapping names?"""
    return (
        r is not None
        and m.token is not None
        and r.holder == m.token
        and r.key == m.key
        and r.resource == m.resource
    )


def on_resource(m: Mapping, r: ResourceItem | None, now_us: int, rules: Rules) -> Decision:
    """A pending mapping ``m`` and its resource item ``r`` (strongly consistent read)."""
    assert m.state == PENDING
    if claim_landed(m, r):
        live = replace(m, state=LIVE)
        if not servable(live, now_us, rules):
            return Extend(live)  # landed, but too close to its end to serve as it is
        return Serve(lease_from_mapping(m), confirm=m)
    if now_us - m.since_us < rules.pending_hold_us:
        return Wait("another daemon is acquiring this key")
    if r is not None and r.version == m.rver:
        return FenceResource(r)
    # The claim can never land (the resource moved past the version it was conditioned on):
    # the mapping is ours to take over.
    return Acquire(m.ver)


# ---------------------------------------------------------------------------- writing
@dataclass(frozen=True, slots=True)
class Won:
    """Both writes applied: serve the claim, confirm the mapping in the background."""


@dataclass(frozen=True, slots=True)
class NextCandidate:
    """The mapping is ours (at ``expect_ver``), the candidate was taken: try another."""

    expect_ver: int


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Our claim applied but the mapping write lost: no mapping names it, free it now."""


@dataclass(frozen=True, slots=True)
class FenceOwnClaim:
    """The mapping write lost and our claim's outcome is unknown: fence the resource (or free
    the claim if it landed) in the background, then re-read."""


@dataclass(frozen=True, slots=True)
class Reread:
    why: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """An outcome is unknown: answer the caller with an error and leave the state as it is; a
    reader resolves a pending mapping by its resource item (on_resource)."""

    why: str


AcquireStep = Won | NextCandidate | GiveBack | FenceOwnClaim | Reread | GiveUp


def after_acquire(mapping: Outcome, claim: Outcome, expect_ver: int) -> AcquireStep:
    """The mapping write (``map_acquire`` at ``expect_ver``) and the claim were sent together."""
    match (mapping, claim):
        case (Outcome.APPLIED, Outcome.APPLIED):
            return Won()
        case (Outcome.APPLIED, Outcome.REJECTED):
            return NextCandidate(expect_ver + 1)
        case (Outcome.REJECTED, Outcome.APPLIED):
            return GiveBack()
        case (Outcome.REJECTED, Outcome.REJECTED):
            return Reread("another daemon wrote the mapping first")
        case (Outcome.REJECTED, Outcome.UNKNOWN):
            return FenceOwnClaim()
    return GiveUp(f"DynamoDB's answer was lost (mapping {mapping.value}, claim {claim.value})")


@dataclass(frozen=True, slots=True)
class Extended:
    """Both writes applied: the cached lease now ends later, confirmed."""


@dataclass(frozen=True, slots=True)
class FreeOrphan:
    """The resource was extended but the mapping no longer names the lease: free the
    resource with quarantine (it was served until now)."""


@dataclass(frozen=True, slots=True)
class CheckMapping:
    """The resource was extended, the mapping was not: that alone proves nothing (another
    daemon may have extended it further, or the write never left). Read the mapping and ask
    ``on_extend_check``."""


@dataclass(frozen=True, slots=True)
class Forget:
    """Drop the cached lease; the next request resolves it from the table."""

    why: str


ExtendStep = Extended | FreeOrphan | CheckMapping | Forget


def after_extend(resource: Outcome, mapping: Outcome | None) -> ExtendStep:
    """``extend_resource`` was sent, then (if it applied) ``map_extend``."""
    if resource is not Outcome.APPLIED:
        return Forget(f"resource extension {resource.value}")
    if mapping is Outcome.APPLIED:
        return Extended()
    if mapping is Outcome.UNKNOWN:
        return Forget("mapping extension unknown")
    return CheckMapping()


def on_extend_check(m: Mapping | None, lease: Lease) -> ExtendStep:
    """After an extension of the resource whose mapping write did not apply: the lease is
    over only if the mapping (read consistently) no longer names it; then nothing can make it
    name it again, and the resource, extended by us, is an orphan."""
    if (
        m is not None
        and m.state != FREE
        and (m.token, m.resource)
        == (
            lease.token,
            lease.resource,
        )
    ):
        return Forget("the mapping still names the lease (extended further elsewhere)")
    return FreeOrphan()


# --------------------------------------------------------------------------- releasing
def on_release_read(own: Mapping | None, now_us: int, rules: Rules) -> Decision:
    """``release(k)`` after a consistent read of our region's mapping."""
    if own is None or own.state == FREE or own.token is None:
        return NotHeld("the key holds no lease in this region")
    if own.state == LIVE:
        assert own.expires_us is not None
        if now_us >= own.expires_us + rules.grace_us:
            return NotHeld("the key's lease has ended")
        return ReleaseLease(lease_from_mapping(own))
    return Verify(own)


def on_release_resource(m: Mapping, r: ResourceItem | None, now_us: int, rules: Rules) -> Decision:
    """``release(k)`` found a pending mapping and read its resource item."""
    if claim_landed(m, r):
        return ReleaseLease(lease_from_mapping(m))
    d = on_resource(m, r, now_us, rules)
    if isinstance(d, Acquire):
        return DropMapping(m)  # the claim never landed: nothing is held
    return d


def cache_valid_until_us(confirmed_us: int, expires_us: int, rules: Rules) -> int:
    """A cached answer is served until the earlier of: S after its confirmation, or the lease
    end minus the margin (both on the daemon's clock)."""
    return min(confirmed_us + rules.confirm_us, expires_us - rules.margin_us)


# ------------------------------------------------------------------------ repair (jobs)
class Orphan(enum.Enum):
    LEASE = "lease"  # the mapping names this claim: a lease (perhaps not yet confirmed)
    FOREIGN = "foreign"  # held by the paper's agent (its holder, if any, is stale): not ours
    ORPHAN = "orphan"  # no mapping names it, and none ever will: free it, with quarantine
    FENCE_MAPPING = "fence_mapping"  # the acquisition's mapping write may still land: fence it


def orphan_verdict(r: ResourceItem, m: Mapping | None) -> Orphan:
    """A held resource item ``r`` and its key's mapping in ``r``'s region (consistent read).

    The claim's acquisition wrote (or tried to write) mapping version ``r.mver``; mapping
    versions only grow, so once the mapping is at or past ``r.mver`` without naming this claim,
    that write either lost or was superseded, and nothing can make the mapping name the claim
    again. Below it (``r.mver - 1``: the write has not landed), the write could still land, so
    the mapping is fenced first.
    """
    assert r.holder is not None
    if not r.holder_current:
        return Orphan.FOREIGN
    if m is not None and m.token == r.holder and m.resource == r.resource and m.state != FREE:
        return Orphan.LEASE
    current = m.ver if m is not None else 0
    if current >= r.mver or (m is None and r.mver > 1):
        # (absent at a version past 1: reaped by TTL long after it moved on)
        return Orphan.ORPHAN
    return Orphan.FENCE_MAPPING


def name_held_until(r: ResourceItem, now_us: int, quarantine_us: int, grace_us: int) -> int:
    """Until when a deleted resource's name stays held (``lease.tombstone``): a re-add is
    claimable no earlier. A held item (deleted with --force; its mapping released first) may
    be served from caches for the quarantine and used by apps until its lease's end plus the
    clock-skew bound (no app released it); a free one is held to the end of its quarantine
    (``quarantine_until``, or a ``lease_available`` in the future)."""
    if r.key is not None:
        ends = [] if r.lease_expires_us is None else [r.lease_expires_us + grace_us]
        return max([now_us + quarantine_us, *ends])
    marks = [parse_time(t) for t in (r.lease_available, r.quarantine_until) if t is not None]
    return max([now_us, *marks])


def orphan_free_at(
    r: ResourceItem, m: Mapping | None, now_us: int, quarantine_us: int, grace_us: int
) -> int:
    """When an orphan ``r`` (``orphan_verdict`` is not LEASE; ``m`` as read for it) may be
    claimed again once repair frees it.

    A claim whose mapping write never landed was never served: the quarantine is enough. That
    is known only while the mapping is present: just below ``r.mver`` (the write not landed;
    repair fences it), or at ``r.mver`` naming another acquisition (ours lost that version).
    Any other orphan may have been named, and answered to apps, before it was left behind:
    by a release or a ``ras-dedupe`` stopped between its two writes, or a crash between an
    extension's two writes. No app need have released it (dedupe releases leases apps still
    use), so it stays unclaimable until its lease's end as the item records it, plus
    ``grace_us`` (the clock-skew bound): an extension writes the item before the mapping, so
    no answer ever ends later than the item's ``lease_expires``.
    """
    available = now_us + quarantine_us
    never_named = m is not None and (
        m.ver == r.mver - 1 or (m.ver == r.mver and m.token != r.holder)
    )
    if never_named or r.lease_expires_us is None:
        return available
    return max(available, r.lease_expires_us + grace_us)


def held_free_at(
    r: ResourceItem, cur: ResourceItem, now_us: int, quarantine_us: int, grace_us: int
) -> int:
    """When a lease no app released (``ras-dedupe``'s extra, ``rasadmin release-resource``),
    its mapping released, may be claimed again: after the quarantine, and not before its end
    plus ``grace_us`` (the clock-skew bound), as read when it was judged (``r``) and as read
    once its mapping no longer names it (``cur``: a daemon may have extended it meanwhile,
    resource first, and answered apps with the later end; no extension can apply any more)."""
    ends = [e for e in (r.lease_expires_us, cur.lease_expires_us) if e is not None]
    return max([now_us + quarantine_us, *(e + grace_us for e in ends)])


def ends_by(r: ResourceItem, m: Mapping, end_by_us: int) -> bool:
    """Does the lease ``r`` (and its mapping ``m``, as read) end by ``end_by_us``? An extra
    that ends later is kept (``ras-dedupe``: its survivor is not served that long)."""
    ends = [e for e in (r.lease_expires_us, m.expires_us) if e is not None]
    return bool(ends) and max(ends) <= end_by_us


# ------------------------------------------------------------------------ ras-dedupe
def outlasts(keep: ResourceItem, extra: ResourceItem, margin_us: int) -> bool:
    """Does the survivor's lease run at least ``margin_us`` past the extra's? Only then do
    the extra's region's daemons, once its mapping is released, serve the survivor for as
    long as apps may still use the extra, instead of acquiring yet another resource there."""
    if keep.lease_expires_us is None or extra.lease_expires_us is None:
        return False
    return keep.lease_expires_us >= extra.lease_expires_us + margin_us


def dedupe_slack(margin_us: int, grace_us: int) -> int:
    """How much longer than an extra its survivor must run: the extra's region serves the
    survivor until its end minus the margin (``skew_margin``) on its own clock, which may run
    ahead by the clock-skew bound (``grace_us``)."""
    return margin_us + grace_us


def survivor_seen_in(keep: ResourceItem, extra: ResourceItem) -> str:
    """The region whose replica the survivor is judged in before ``extra`` is released: the
    extra's (its daemons serve the survivor once the extra's mapping is released, from what
    their replica shows, where a confirm or an extension may not have arrived yet)."""
    return extra.region


def served_end(keep: ResourceItem, m: Mapping | None) -> int | None:
    """Until when the daemons that read mapping ``m`` (the survivor's, as one region's replica
    shows it) serve the survivor ``keep``: the earlier of its item's and its mapping's end, if
    that replica shows it live (daemons serve only live mappings of other regions; a confirm
    or an extension may not have replicated yet). None: that region does not serve it."""
    if m is None or m.state != LIVE or (m.token, m.resource) != (keep.holder, keep.resource):
        return None
    ends = [e for e in (keep.lease_expires_us, m.expires_us) if e is not None]
    return min(ends) if ends else None


# ------------------------------------------------------------ leases of the paper's agent
def adoptable(
    r: ResourceItem | None, client_id: str, pool_id: str, key: str, region: str, now_us: int
) -> bool:
    """Is ``r`` (read strongly consistently) a running lease of ``key`` in our region that
    rasd may adopt? Asked only when the key's mapping names no lease here
    (:func:`on_read` said Acquire), so no acquisition of ours serves it: the paper's agent
    took it (or a crash left it, held for this same key). Adoption keeps it where it is."""
    return (
        r is not None
        and r.key == key
        and r.client_id == client_id
        and r.pool_id == pool_id
        and r.region == region
        and r.lease_expires_us is not None
        and r.lease_expires_us > now_us
    )


@dataclass(frozen=True, slots=True)
class Settle:
    """Beside the paper's agent: a pending mapping whose claim landed (``mapping``) is not
    served, by its acquirer or a reader, before one more look at the leased index made after
    the claim landed (:func:`on_settle`) and, if that shows no rival, the mapping confirmed."""

    mapping: Mapping


@dataclass(frozen=True, slots=True)
class Confirm:
    """No rival: write ``mapping`` live (``map_confirm``) and serve it once that applied."""

    mapping: Mapping


@dataclass(frozen=True, slots=True)
class YieldTo:
    """A lease of the paper's agent for the key in our region, ``item``, was made while our
    claim was in flight: adopt it at the pending mapping's version (our claim, which no one
    was answered with, is then given back)."""

    mapping: Mapping
    item: ResourceItem


def beside_legacy(d: Decision | Settle) -> Decision | Settle:
    """With ``legacy_agents``: what to do instead of serving a pending mapping whose claim
    landed (``Serve`` with ``confirm``): settle it, whoever reads it, its acquirer or another
    daemon (``on_settle``; a settle's writes are conditional on the pending mapping's
    version, so of two that race one wins, and nothing is answered before it won). Every
    other decision is unchanged (a Settle too)."""
    if isinstance(d, Serve) and d.confirm is not None:
        return Settle(d.confirm)
    return d


#: A claim of rasd's that no mapping names is a rival (:func:`rival`) only once it is this old
#: (microseconds): a younger one is, as a rule, the losing side of a race for the key whose
#: acquirer is giving it back at that moment. Yielding to it would chase a claim that is
#: being freed, and two daemons racing one key would yield to each other until the deadline.
ORPHAN_RIVAL_AGE_US = 2_000_000


def rival(m: Mapping, held: list[ResourceItem], now_us: int) -> ResourceItem | None:
    """Another running lease of ``m``'s key and region in ``held`` (the leased index, read
    after ``m``'s claim landed), or None: the paper's agent's, or a claim of rasd's that no
    mapping names and that is older than ``ORPHAN_RIVAL_AGE_US`` (its acquisition lost the
    mapping or its outcome was unknown, and no give-back followed: never served by rasd, but
    the paper's agent answers whatever the index shows for the key). ``m`` is the key's
    mapping in the region, so no other item held for the key there is a rasd lease. The
    earliest, as ``pick`` orders them (the paper's agent's lookup makes the same choice).

    Not covered: the paper's agent answering a losing claim of rasd's in the moment before it
    is given back (docs/design.md, "Two agents acquiring one key at once")."""
    found = [
        it
        for it in held
        if it.resource != m.resource
        and adoptable(it, m.client_id, m.pool_id, m.key, m.region, now_us)
        and not (
            it.holder_current and now_us - (it.lease_acquired_us or now_us) < ORPHAN_RIVAL_AGE_US
        )
    ]
    return pick(found)


def on_settle(m: Mapping, held: list[ResourceItem], now_us: int) -> Confirm | YieldTo:
    """A pending mapping ``m`` whose claim landed, and the leased index read after that.

    The paper's agent decides from the index alone and its claim is conditioned on nothing
    about the key, so while both agents acquire a key at once either can make the second
    lease. This rule makes it never rasd's answer: rasd serves its claim only if an index
    read made after the claim landed shows no rival; a rival that shows up later was made by
    the paper's agent after our lease was in the index (docs/design.md, "Two agents acquiring
    one key at once")."""
    r = rival(m, held, now_us)
    return Confirm(m) if r is None else YieldTo(m, r)


@dataclass(frozen=True, slots=True)
class EndLapsed:
    """Beside the paper's agent: our lease is past its end as its resource item records it
    (no answer of it, rasd's or the paper's agent's, runs any more). End it (the mapping
    released at the version read, then the resource freed) and read again: the key acquires
    anew, adopting what the paper's agent may have leased it since its end."""

    mapping: Mapping


def on_lapsed(m: Mapping, r: ResourceItem | None, now_us: int) -> Extend | EndLapsed:
    """With ``legacy_agents``: ``on_read`` said Extend for our lease ``m`` already past its
    end (on the mapping), and ``r`` is its resource item, read consistently after.

    The paper's agent takes a lease's end as final: past it, its lookup sees no lease and it
    claims another resource for the key. Extending ours then would make it run again beside
    that one. The item, not the mapping, says whether it is over: an extension writes the
    item first (the mapping can lag it), and both agents answer at most the item's end. An
    item that still runs is extended as before; one whose end has passed, or that no longer
    carries our claim, is ended."""
    held = r is not None and r.holder == m.token and r.key == m.key
    if held and r is not None and r.lease_expires_us is not None and r.lease_expires_us > now_us:
        return Extend(m)
    return EndLapsed(m)
