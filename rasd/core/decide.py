"""What to do with what was read: the acquisition protocol's decisions. Pure: no I/O.

:func:`on_read`, :func:`on_resource`, :func:`after_acquire`, :func:`after_extend`,
:func:`on_release_read`, and the rules of a lease itself (:func:`check_expiry`,
:func:`should_extend`, :func:`pick_mapping`, :func:`pick`). Beside the paper's agent:
:mod:`rasd.core.legacy`; the jobs': :mod:`rasd.core.verdicts`. The steps and why they keep
the invariants: docs/design.md, "get_lease" and "Arguments, interleaving by interleaving".
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, replace

from .lease import FREE, LIVE, PENDING, US, Lease, Mapping, ResourceItem


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
    #: beside the paper's agent, a lease is extended only while it ends more than this after
    #: the extension is sent (the clock-skew bound; 0: up to its end): ``legacy.extend_floor``
    extend_margin_us: int = 0


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
    """Our region's lease is too close to its end to serve: extend it first (R, then M).
    ``pending``: the mapping was pending and its claim landed (``mapping`` is it as live):
    beside the paper's agent it is settled before anything extends it (``legacy``)."""

    mapping: Mapping
    pending: Mapping | None = None


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
    """Read again later. ``until_us``: this host's time before which reading again cannot
    end the wait (a lease's end plus the clock-skew bound); None: soon, another daemon may
    finish what it does at any moment."""

    why: str
    until_us: int | None = None


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
    """Does the resource item carry the claim the mapping names? Not when the holder is
    stale: the paper's liberator freed the claim and its agent leased the item again."""
    return (
        r is not None
        and m.token is not None
        and r.holder == m.token
        and r.holder_current
        and r.key == m.key
        and r.resource == m.resource
    )


def on_resource(m: Mapping, r: ResourceItem | None, now_us: int, rules: Rules) -> Decision:
    """A pending mapping ``m`` and its resource item ``r`` (strongly consistent read)."""
    assert m.state == PENDING
    if claim_landed(m, r):
        live = replace(m, state=LIVE)
        if not servable(live, now_us, rules):
            return Extend(live, pending=m)  # landed, but too close to its end to serve
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
    """Our claim applied but the mapping write lost: no mapping names it, free it now
    (``given_back(proof)`` says for how long it stays unclaimable)."""

    proof: NeverNamed | None = None


@dataclass(frozen=True, slots=True)
class FenceOwnClaim:
    """The mapping write lost and our claim's outcome is unknown: fence the resource (or free
    the claim if it landed) in the background, then re-read."""

    proof: NeverNamed | None = None


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
    """The mapping write (``map_acquire`` at ``expect_ver``) and the claim were sent together
    (or, with ``legacy_agents``, the claim only once the mapping applied: a claim not sent
    is passed as REJECTED, since it is not on the item)."""
    match (mapping, claim):
        case (Outcome.APPLIED, Outcome.APPLIED):
            return Won()
        case (Outcome.APPLIED, Outcome.REJECTED):
            return NextCandidate(expect_ver + 1)
        case (Outcome.REJECTED, Outcome.APPLIED):
            return GiveBack(never_named(mapping))
        case (Outcome.REJECTED, Outcome.REJECTED):
            return Reread("another daemon wrote the mapping first")
        case (Outcome.REJECTED, Outcome.UNKNOWN):
            return FenceOwnClaim(never_named(mapping))
    return GiveUp(f"DynamoDB's answer was lost (mapping {mapping.value}, claim {claim.value})")


@dataclass(frozen=True, slots=True)
class Extended:
    """Both writes applied: the cached lease now ends later, confirmed."""


@dataclass(frozen=True, slots=True)
class FreeOrphan:
    """The resource was extended but the mapping no longer names the lease: free the
    resource. No app released it, and apps may use it to the end they were answered
    (``Freed.UNRELEASED``)."""


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


# ------------------------------------------------------------------------- early frees
class Freed(enum.Enum):
    """Why a daemon frees a resource before its lease's end: what the free must wait for."""

    #: an app released the lease: every copy of its answer lapses within the quarantine
    RELEASED = "released"
    #: a claim of ours no mapping ever named, nor ever will: nobody was answered with it.
    #: Only :func:`given_back` hands it out, on a :class:`NeverNamed` proof.
    UNNAMED = "unnamed"
    #: a lease apps may still use and that no app released (a mapping lost to ``ras-dedupe``
    #: or to a reader's takeover, a claim whose naming is unknown or that a reader may have
    #: answered, a lapsed lease beside the paper's agent)
    UNRELEASED = "unreleased"


@dataclass(frozen=True, slots=True)
class NeverNamed:
    """Proof that no mapping ever named a claim of ours, so no app was answered with it:
    the only write that could name it (its acquisition's ``map_acquire``) was refused by
    its condition. Made only by :func:`never_named`."""

    write: str


def never_named(mapping: Outcome) -> NeverNamed | None:
    """The proof, from the outcome of the claim's ``map_acquire``: REJECTED (it did not and
    will not apply: its condition failed, it was never sent, or the item read back after a
    lost reply shows another write took the version it would have written,
    ``map_builders.read_back``). Anything else, an unknown outcome above all, proves
    nothing."""
    return NeverNamed("map_acquire") if mapping is Outcome.REJECTED else None


def given_back(proof: NeverNamed | None) -> Freed:
    """The one rule for a claim of ours given back that no app released: with the
    quarantine only when it was never named (``proof``); otherwise a reader may have
    answered it, and it is held to its lease's end plus the skew (I1). Every give-back
    of a claim the daemon acquired goes through here."""
    return Freed.UNNAMED if isinstance(proof, NeverNamed) else Freed.UNRELEASED


def holds_to_end(why: Freed, legacy_agents: bool) -> bool:
    """Whether an early free keeps the resource unclaimable until its lease's end plus the
    skew, as well as for the quarantine. Always for a lease no app released (I1: its answers
    run to their end), and for every free while the paper's agent may run (it answers
    whatever the leased index shows, to its end, and is never told of a release)."""
    return why is Freed.UNRELEASED or legacy_agents


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


# ---------------------------------------------------------------------------- rules of a lease
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


def after_extend_read(
    dec: Decision, lease: Lease, requested_us: int, now_us: int, fraction: float
) -> Lease | Forget | None:
    """A hit's background extension first reads the key's mappings (``dec``: :func:`on_read`
    of that read): another host serving the key may have extended it already. Still our
    lease, with an end that needs no extension now: that lease, to serve as read with
    nothing written (the mapping's end never passes the resource's, nor the agreement's).
    Still ours, ending too soon, or our acquisition whose confirmation has not landed yet
    (pending: the extension writes it live, as without the read): None, extend it. Anything
    else: forget it."""
    if isinstance(dec, Serve) and not dec.foreign and same_lease(dec.lease, lease):
        return None if should_extend(dec.lease, requested_us, now_us, fraction) else dec.lease
    m, ours = (
        dec.mapping if isinstance(dec, (Extend, Verify)) else None,
        (lease.token, lease.resource),
    )
    if m is not None and lease.token is not None and (m.token, m.resource) == ours:
        return None
    return Forget("the extension's read found another lease")


def same_lease(a: Lease, b: Lease) -> bool:
    """Are ``a`` and ``b`` one lease: one claim (its token) on one resource? Ends may differ
    (an extension moves the end, not the claim)."""
    return a.token is not None and a.token == b.token and a.resource == b.resource


def _interned(
    of: ResourceItem | Mapping,
    resource: str,
    expires_us: int,
    version: int,
    acquired_us: int,
    token: str | None,
) -> Lease:
    """The lease of ``of``'s key. Client, pool and region repeat across every cached lease:
    one string each is shared."""
    assert of.key is not None
    return Lease(
        client_id=sys.intern(of.client_id),
        pool_id=sys.intern(of.pool_id),
        key=of.key,
        resource=resource,
        region=sys.intern(of.region),
        expires_us=expires_us,
        version=version,
        acquired_us=acquired_us,
        token=token,
    )


def lease_from_mapping(m: Mapping) -> Lease:
    """The lease a live (or verified pending) mapping names."""
    assert m.resource is not None and m.expires_us is not None
    return _interned(m, m.resource, m.expires_us, m.rver + 1, m.since_us, m.token)


def lease_from_item(item: ResourceItem) -> Lease:
    """The lease a held resource item stands for (jobs; tests)."""
    assert item.key is not None and item.lease_expires_us is not None
    acquired_us = item.lease_acquired_us or 0
    return _interned(
        item, item.resource, item.lease_expires_us, item.version, acquired_us, item.holder
    )


def pick_mapping(ms: list[Mapping]) -> Mapping | None:
    """The one mapping that stands for a key when several regions hold it (a cross-region
    race). Earliest acquisition wins, then region, then resource (:func:`on_read`'s order):
    the choice ``ras-dedupe`` makes, so every daemon in every region converges on the lease
    that survives clean-up."""
    return min(ms, key=_order) if ms else None


def pick(items: list[ResourceItem]) -> ResourceItem | None:
    """The same choice as :func:`pick_mapping`, among resource items (``ras-dedupe``)."""
    if not items:
        return None
    return min(items, key=lambda it: (it.lease_acquired_us or 0, it.region, it.resource))
