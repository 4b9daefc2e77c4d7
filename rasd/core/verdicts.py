"""The jobs' decisions: orphans, deleted resources' names and duplicate leases. Pure: no I/O.

:func:`orphan_verdict`, :func:`orphan_free_at`, :func:`held_free_at`,
:func:`name_held_until`, and ``ras-dedupe``'s survivor checks (:func:`outlasts`,
:func:`dedupe_slack`, :func:`survivor_seen_in`, :func:`served_end`, :func:`ends_by`):
docs/design.md, "The jobs, written once" and "Arguments, interleaving by interleaving".
"""

from __future__ import annotations

import enum

from .lease import FREE, LIVE, Mapping, ResourceItem, parse_time


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
