"""The daemon's local policy: when its lease cache answers, and what a hit asks for after.
Pure: every time is passed in.

:func:`valid_until`, :func:`keeps_current`, :func:`hit_wants_refresh`, :func:`refresh_of`,
the outage window; run by the lease cache, the renewer and the checker's model of a daemon
(docs/design.md, I3 and "An outage budget").
"""

from __future__ import annotations

import enum

from .decide import Rules, should_extend
from .lease import US, Lease, Pool


def valid_until(
    confirmed: float, confirm_s: float, now: float, expires_us: int, margin_us: int, now_us: int
) -> float:
    """Until when (monotonic seconds) an answer confirmed at ``confirmed`` is served: the
    earlier of ``confirmed + S`` and the lease's end less the skew margin, that end read on
    the wall clock (``now_us``) and carried over to the monotonic one (``now``)."""
    return min(confirmed + confirm_s, now + (expires_us - margin_us - now_us) / US)


def serves(until: float, now: float) -> bool:
    """Does an entry valid until ``until`` still answer at monotonic time ``now``?"""
    return now < until


def keeps_current(cur_confirmed: float, cur_until: float, confirmed: float, now: float) -> bool:
    """A put of an answer confirmed at ``confirmed`` leaves the current entry in place when
    that entry was confirmed later and still answers: an older confirmation (a read sent
    before a newer write, say) never replaces a newer one."""
    return cur_confirmed > confirmed and serves(cur_until, now)


def stale(confirmed: float, now: float, confirm_s: float) -> bool:
    """Past half of S since the last confirmation: re-confirm in the background, so that a
    busy key never drops out of the cache."""
    return now - confirmed > confirm_s / 2


#: ``extend_from_us`` of a lease this daemon never extends (another region's)
NEVER = 2**63 - 1


def extend_from(lease: Lease, region: str) -> int:
    """From which requested end a hit on ``lease`` may call for an extension: the lease's
    end for a lease of this daemon's ``region``, never for another region's."""
    return lease.expires_us if lease.region == region else NEVER


def hit_wants_refresh(
    confirmed: float, now: float, confirm_s: float, requested_us: int, extend_from_us: int
) -> bool:
    """Does a hit call for background work: stale, or asking for a later end than the lease
    has (``extend_from_us``: the lease's end, or never for another region's)? Then
    :func:`refresh_of` says which."""
    return stale(confirmed, now, confirm_s) or requested_us > extend_from_us


def extend_due_us(lease: Lease, ask_us: int, fraction: float) -> int:
    """From which wall time ``decide.should_extend`` holds for a sliding ask ``ask_us`` long
    (each call asking for its now + ``ask_us``): the lease's end less ``fraction`` of it.
    The hit table's touch (``rasd_client._table``) compares the clock with it."""
    return lease.expires_us - int(fraction * ask_us)


class Refresh(enum.Enum):
    """What a hit starts in the background."""

    EXTEND = "extend"  # a sliding lease close enough to its end (``decide.should_extend``)
    RECONFIRM = "reconfirm"  # a consistent re-read of the key's mappings


def refresh_of(
    lease: Lease,
    region: str,
    requested_us: int,
    now_us: int,
    extend_fraction: float,
    is_stale: bool,
    backing_off: bool = False,
) -> Refresh | None:
    """After a hit: extend a lease of this region that needs it (unless the last attempt
    failed and its backoff runs, ``backing_off``), else re-confirm a stale answer, else
    nothing."""
    if (
        lease.region == region
        and lease.token is not None
        and should_extend(lease, requested_us, now_us, extend_fraction)
    ):
        return None if backing_off else Refresh.EXTEND
    return Refresh.RECONFIRM if is_stale else None


# ------------------------------------------------------------------- an outage budget
def outage_window_us(rules: Rules, pool: Pool) -> int:
    """How long after its last confirmation a host that cannot reach DynamoDB serves a
    cached answer of ``pool``: S, or the pool's outage budget, never more than the pool's
    quarantine covers on this host's bounds (I1: a released resource is claimable only
    ``quarantine - skew`` after its release, and a copy read from another region's replica
    may be ``replication_lag`` late)."""
    lag_us = rules.quarantine_us - rules.confirm_us - rules.grace_us
    covered = pool.quarantine_us - rules.grace_us - lag_us
    return max(rules.confirm_us, min(pool.outage_budget_us, covered))
