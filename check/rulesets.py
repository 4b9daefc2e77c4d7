"""The rules the model's actors follow: the real ones (``rasd.core.decide``), or a known-bad set.

A known-bad rule set puts one bug back by replacing one decision (or, for the balancer, one
piece of its driver's wiring): A, B and C are the old acquisition protocol's (acting on an
unknown mapping write, trusting one's own claim, freeing early with no quarantine); D1-D6
are ras-dedupe's and orphan repair's (an unversioned release, a pending survivor, a margin
short of the clock skew, the survivor judged in the wrong replica, an orphan freed with the
quarantine only, an orphan that became a lease released as one); Q and H are beside the
paper's agent (a quarantine inside the available index, a stale holder taken as current);
R is rasadmin's (a quarantined item deleted and re-added claimable at once), M the
balancer's (a move written in the wrong replica), S, P and L beside the paper's agent (a
won claim served unsettled; a pending mapping extended unsettled; a lapsed lease ended on
the reader's clock alone); X a daemon's (an extension found done by its read taken as
reaching the end asked); G is a strict pool's (its agreement skipped); T1 and T2 are a
lost reply's read-back taken as a refusal and a claim given back with the quarantine only
without proof that nobody was answered with it; HT a hit table read past S. The jobs'
programs read them through their ``ops``; T1 is the drivers' read-back rule, which the
model's interpreter applies. They live here, never in production code: a checker that
cannot find them proves nothing (tests/unit/test_check.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from rasd.core import builders, cache_rules, decide, rollout, verdicts
from rasd.core import legacy as legacy_rules
from rasd.core.decide import Outcome, Rules, lease_from_mapping
from rasd.core.lease import LIVE, PENDING, Lease, Mapping, Pool, ResourceItem
from rasd.core.map_builders import map_release
from rasd.core.writes import ItemKey, Write
from rasd.steps import Program
from rasd.steps.admin import ADMIN_OPS, AdminOps
from rasd.steps.daemon import REAL as REAL_OPS
from rasd.steps.daemon import Ops
from rasd.steps.repair import Ops as JobOps
from rasd.steps.repair import Result, release_held

INFINITY_US = 10**15


@dataclass(frozen=True)
class Protocol:
    """Which decision functions, and which early-free rule, the daemons use."""

    name: str = "real"
    #: A: after (mapping UNKNOWN, claim APPLIED) give the claim back, claimable at once
    act_on_unknown: bool = False
    #: B: serve a pending mapping without reading its resource; serve a claim APPLIED even
    #: when the mapping write lost
    trust_own_claim: bool = False
    #: C: early frees claimable at once, and caches served to the lease end (S = infinity)
    no_quarantine: bool = False
    #: D1 (an unversioned ras-dedupe): release an extra on the check of the scan's items
    #: only (no end re-checked on its mapping), with an unconditional ``map_release``
    dedupe_unversioned: bool = False
    #: D2 (ras-dedupe trusting pending mappings): a survivor whose mapping is still pending
    #: counts as served (its end stands in for the extra's), though other regions serve only
    #: live ones
    dedupe_pending_survivor: bool = False
    #: D3: the survivor must outlast an extra by the
    #: margin only, not margin + skew
    dedupe_margin_only: bool = False
    #: D4: the survivor judged in its own region's
    #: replica, not in the extra's (where a confirm may not have replicated yet)
    dedupe_survivor_own_region: bool = False
    #: D5: orphan repair frees with the
    #: quarantine only, though a ras-dedupe stopped between its two writes leaves an orphan
    #: whose lease apps still use to its end
    orphan_quarantine_only: bool = False
    #: D6: ras-dedupe releases an item it examined as an
    #: orphan even when its mapping write has landed since (a lease, perhaps served): with
    #: the quarantine only, and with no check that a survivor outlasts it
    dedupe_orphan_as_lease: bool = False
    #: Q: an early free's quarantine is a future
    #: ``lease_available``, inside the available index; an agent that claims on the version
    #: alone takes the item while caches still serve it
    quarantine_in_index: bool = False
    #: H (no ``hver``): a holder is taken as current whatever wrote the item since, so orphan
    #: repair frees a lease the paper's agent made after its liberator left a stale holder
    holder_always_current: bool = False
    #: R: ``delete-resource`` takes an early-freed item whose
    #: quarantine runs (a cache may still serve it) without ``--force``...
    admin_delete_quarantined: bool = False
    #: ... and the deleted name is held no longer than now, so ``add-resources`` makes it
    #: claimable at once (R sets both; each alone is kept out by the other)
    admin_no_hold: bool = False
    #: M (the balancer without ``--peer-endpoint``): a move of another region's item is
    #: written in the balancer's own replica, racing that region's claims by last-writer-wins
    balancer_no_peers: bool = False
    #: E: a daemon gives back a lease no app released (an extension whose mapping
    #: ``ras-dedupe`` released meanwhile) with the quarantine only, unless the paper's agent
    #: may run: apps answered with it before use it to its end
    unreleased_quarantine_only: bool = False
    #: S (with ``legacy_agents``): a won claim is confirmed and served
    #: whatever the leased index shows after it landed, so rasd may make a key's second
    #: lease beside the paper's agent's
    settle_never_yields: bool = False
    #: P (with ``legacy_agents``): a reader that finds a pending mapping whose claim landed
    #: too close to its end to serve extends it, writing it live, without settling it first
    extend_unsettled: bool = False
    #: L (with ``legacy_agents``): a lease past its end on the reader's clock is ended and
    #: the key acquired anew at once, though a host whose clock is behind still serves it
    lapsed_own_clock: bool = False
    #: X: a background extension that reads our lease still mapped takes it as extended to
    #: the end asked for and writes nothing, whatever end the mapping shows
    extend_read_trusts_ask: bool = False
    #: G (a strict pool without its agreement): the daemons answer their region's claim
    #: without agreeing it in the home region, as in a normal pool
    skip_agreement: bool = False
    #: T1: a write whose reply was lost and whose retry was refused is taken as REJECTED
    #: when the item read back does not show it, though it may have applied and been
    #: written over since (a reader answered its claim, a job released it)
    readback_absent_rejects: bool = False
    #: T2: every claim of ours given back needs the quarantine only, proof or none (a
    #: strict pool's withdrawn claim, which a reader may have answered by the fallback)
    give_back_unproven: bool = False
    #: T3: ``rasadmin adopt`` takes a held item whose holder is current for rasd's lease
    #: without reading that the key's mapping names it, so a losing claim the fast rules
    #: left (its give-back never went out) stays in the leased index for the paper's agent
    adopt_trusts_holder: bool = False
    #: W (the rollout switch): ``end-rollout`` turns the record off once no lease of the
    #: paper's agent is in the table, not waiting for the ends of the leases that agent may
    #: have answered (its own that rasd adopted, rasd's it found by the key); the fast rules
    #: then free them early while those answers run
    end_rollout_undrained: bool = False
    #: O (an outage budget): an app's release keeps the resource out for the daemons' Q,
    #: not the pool's own quarantine, while a host cut off from DynamoDB serves its cached
    #: answer for the budget
    daemon_q_only: bool = False
    #: O2 (an outage budget): a host cut off serves a cached answer for twice the budget,
    #: past what the pool's quarantine covers
    window_past_quarantine: bool = False
    #: HT (the hit table): a table entry read up to the lease's end less the margin, as if
    #: published without S
    table_past_s: bool = False

    def orphan_verdict(self, r: ResourceItem, m: Mapping | None) -> verdicts.Orphan:
        """The liberator's verdict on a held item (``rasd.core.verdicts.orphan_verdict``)."""
        if self.holder_always_current and r.holder is not None:
            r = replace(r, hver=None)
        return verdicts.orphan_verdict(r, m)

    def holds_to_end(self, why: decide.Freed, legacy_agents: bool) -> bool:
        """Whether a daemon's early free waits for the lease's end (``decide.holds_to_end``)."""
        if self.unreleased_quarantine_only:
            return legacy_agents
        return decide.holds_to_end(why, legacy_agents)

    def given_back(self, proof: decide.NeverNamed | None) -> decide.Freed:
        """Why a claim of ours is given back (``decide.given_back``)."""
        if self.give_back_unproven:
            return decide.Freed.UNNAMED
        return decide.given_back(proof)

    def on_end(
        self, paper_found: bool, seen: rollout.Rollout, until_us: int, now_us: int
    ) -> rollout.End:
        """``end-rollout``'s decision (``rollout.on_end``)."""
        step = rollout.on_end(paper_found, seen, until_us, now_us)
        if self.end_rollout_undrained and step in (rollout.End.MARK, rollout.End.WAIT):
            return rollout.End.TURN_OFF
        return step

    def early_free(self, w: Write) -> Write:
        """An early free as this rule set writes it."""
        if not self.quarantine_in_index:
            return w
        renamed = tuple(("lease_available" if a == "quarantine_until" else a, v) for a, v in w.set)
        return replace(w, set=renamed)

    # ---------------------------------------------------------------- the decisions
    def on_read(
        self, own: Mapping | None, others: list[Mapping], now_us: int, rules: Rules
    ) -> decide.Decision:
        if (
            self.trust_own_claim
            and own is not None
            and own.state == PENDING
            and own.expires_us is not None
            and own.expires_us - rules.margin_us > now_us
        ):
            return decide.Serve(lease_from_mapping(own), confirm=own)
        return decide.on_read(own, others, now_us, rules)

    def on_settle(
        self, m: Mapping, held: list[ResourceItem], now_us: int, grace_us: int = 0
    ) -> legacy_rules.Confirm | legacy_rules.YieldTo | decide.Wait:
        if self.settle_never_yields:
            return legacy_rules.Confirm(m)
        return legacy_rules.on_settle(m, held, now_us, 0 if self.lapsed_own_clock else grace_us)

    def beside_legacy(
        self, d: decide.Decision | legacy_rules.Settle
    ) -> decide.Decision | legacy_rules.Settle:
        if self.extend_unsettled and isinstance(d, decide.Extend):
            return d
        return legacy_rules.beside_legacy(d)

    def on_lapsed(
        self, m: Mapping, r: ResourceItem | None, now_us: int, grace_us: int, margin_us: int = 0
    ) -> decide.Extend | decide.Wait | legacy_rules.EndLapsed:
        return legacy_rules.on_lapsed(
            m, r, now_us, 0 if self.lapsed_own_clock else grace_us, margin_us
        )

    def lapsing(
        self,
        held: list[ResourceItem],
        client_id: str,
        pool_id: str,
        key: str,
        region: str,
        now_us: int,
        grace_us: int,
    ) -> ResourceItem | None:
        """``legacy.lapsing``: L judges a lease's end on the reader's clock alone here too."""
        grace = 0 if self.lapsed_own_clock else grace_us
        return legacy_rules.lapsing(held, client_id, pool_id, key, region, now_us, grace)

    def on_resource(self, m: Mapping, r: object, now_us: int, rules: Rules) -> decide.Decision:
        return decide.on_resource(m, r, now_us, rules)  # type: ignore[arg-type]

    def after_acquire(
        self, mapping: Outcome, claim: Outcome, expect_ver: int
    ) -> decide.AcquireStep:
        if claim is Outcome.APPLIED and mapping is not Outcome.APPLIED:
            if self.trust_own_claim:
                return decide.Won()
            if self.act_on_unknown and mapping is Outcome.UNKNOWN:
                return decide.GiveBack(decide.NeverNamed("A: taken as never named"))
        return decide.after_acquire(mapping, claim, expect_ver)

    def after_extend(self, resource: Outcome, mapping: Outcome | None) -> decide.ExtendStep:
        return decide.after_extend(resource, mapping)

    def on_extend_check(self, m: Mapping | None, lease: Lease) -> decide.ExtendStep:
        return decide.on_extend_check(m, lease)

    def after_extend_read(
        self, dec: decide.Decision, lease: Lease, requested_us: int, now_us: int, fraction: float
    ) -> Lease | decide.Forget | None:
        got = decide.after_extend_read(dec, lease, requested_us, now_us, fraction)
        if self.extend_read_trusts_ask and not isinstance(got, decide.Forget):
            return replace(lease, expires_us=requested_us)
        return got

    def quarantine_us(self, rules: Rules, give_back: bool, pool_q_us: int) -> int:
        """How long an early free (release, give-back, orphaned extension) stays
        unclaimable: A gives a lost acquisition's claim back at once, C frees all at once,
        O ignores the pool's own quarantine (an outage budget's)."""
        if self.no_quarantine or (self.act_on_unknown and give_back):
            return 0
        if self.daemon_q_only:
            return rules.quarantine_us
        return max(rules.quarantine_us, pool_q_us)

    def free_claim(
        self,
        ident: ItemKey,
        key: str,
        token: str,
        now_us: int,
        available_us: int,
        expires_us: int | None = None,
    ) -> Write:
        """``rasd.core.builders.free_claim`` as this rule set writes it."""
        return self.early_free(
            builders.free_claim(ident, key, token, now_us, available_us, expires_us)
        )

    def outage_window_us(self, rules: Rules, pool: Pool) -> int:
        """How long a host cut off from DynamoDB serves a cached answer of ``pool``
        (``decide.outage_window_us``); O2 twice the budget."""
        if self.window_past_quarantine:
            return 2 * cache_rules.outage_window_us(rules, pool)
        return cache_rules.outage_window_us(rules, pool)

    def table_serves(
        self, until: float, expires_us: int, t: int, margin_us: int, offset: int
    ) -> bool:
        """Does the hit table answer an entry valid ``until`` at true tick ``t``
        (``rasd_client._table``)? HT: up to its lease's end (``expires_us``) less the
        margin, on the host's clock (``offset``)."""
        if self.table_past_s:
            return t < (expires_us - margin_us) / 1_000_000 - offset
        return cache_rules.serves(until, t)

    def rules(self, real: Rules) -> Rules:
        # Beside the paper's agent a lease is extended only while it ends more than the
        # clock-skew bound after the extension is sent, as ``Config.rules`` ships it. With
        # the model's margin equal to that bound, every lease too close to its end to serve
        # is too close to extend: P, an unsettled extension of such a lease, is put back
        # with the extension as it was when P was found (up to the lease's end).
        real = replace(real, extend_margin_us=0 if self.extend_unsettled else real.grace_us)
        if self.no_quarantine:
            return replace(real, confirm_us=INFINITY_US)
        return real


REAL = Protocol()
BAD_A = Protocol("A-act-on-unknown", act_on_unknown=True)
BAD_B = Protocol("B-trust-own-claim", trust_own_claim=True)
BAD_C = Protocol("C-no-quarantine", no_quarantine=True)
BAD_D1 = Protocol("D1-dedupe-unversioned", dedupe_unversioned=True)
BAD_D2 = Protocol("D2-dedupe-pending-survivor", dedupe_pending_survivor=True)
BAD_D3 = Protocol("D3-dedupe-margin-only", dedupe_margin_only=True)
BAD_D4 = Protocol("D4-dedupe-survivor-own-region", dedupe_survivor_own_region=True)
BAD_D5 = Protocol("D5-orphan-quarantine-only", orphan_quarantine_only=True)
BAD_D6 = Protocol("D6-dedupe-orphan-as-lease", dedupe_orphan_as_lease=True)
BAD_Q = Protocol("Q-quarantine-in-index", quarantine_in_index=True)
BAD_H = Protocol("H-holder-always-current", holder_always_current=True)
BAD_R = Protocol("R-admin-readd-at-once", admin_delete_quarantined=True, admin_no_hold=True)
BAD_M = Protocol("M-balancer-no-peers", balancer_no_peers=True)
BAD_S = Protocol("S-settle-never-yields", settle_never_yields=True)
BAD_E = Protocol("E-unreleased-quarantine-only", unreleased_quarantine_only=True)
BAD_P = Protocol("P-extend-unsettled", extend_unsettled=True)
BAD_L = Protocol("L-lapsed-on-own-clock", lapsed_own_clock=True)
BAD_G = Protocol("G-agreement-skipped", skip_agreement=True)
BAD_T1 = Protocol("T1-readback-absent-rejects", readback_absent_rejects=True)
BAD_T2 = Protocol("T2-give-back-unproven", give_back_unproven=True)
BAD_T3 = Protocol("T3-adopt-trusts-holder", adopt_trusts_holder=True)
BAD_W = Protocol("W-end-rollout-undrained", end_rollout_undrained=True)
BAD_X = Protocol("X-extend-read-trusts-ask", extend_read_trusts_ask=True)
BAD_O = Protocol("O-release-daemon-quarantine", daemon_q_only=True)
BAD_O2 = Protocol("O2-window-past-quarantine", window_past_quarantine=True)
BAD_HT = Protocol("HT-table-past-s", table_past_s=True)
BAD = (BAD_A, BAD_B, BAD_C)
BAD_DEDUPE = (BAD_D1, BAD_D2)
PROTOCOLS = {
    p.name: p
    for p in (
        REAL,
        BAD_A,
        BAD_B,
        BAD_C,
        BAD_D1,
        BAD_D2,
        BAD_D3,
        BAD_D4,
        BAD_D5,
        BAD_D6,
        BAD_G,
        BAD_T1,
        BAD_T2,
        BAD_T3,
        BAD_W,
        BAD_X,
        BAD_O,
        BAD_O2,
        BAD_HT,
        BAD_Q,
        BAD_H,
        BAD_R,
        BAD_M,
        BAD_S,
        BAD_E,
        BAD_P,
        BAD_L,
    )
}


# ------------------------------------------------------------- the jobs' programs' ops
def _holder_always_current(r: ResourceItem, m: Mapping | None) -> verdicts.Orphan:
    return verdicts.orphan_verdict(replace(r, hver=None) if r.holder is not None else r, m)


def _quarantine_only(r: ResourceItem, m: Mapping | None, now: int, q: int, g: int) -> int:
    return now + q


def _map_release_unversioned(
    ident: ItemKey, token: str, now_us: int, ver: int | None = None
) -> Write:
    return map_release(ident, token, now_us)


def _served_forever(keep: ResourceItem, m: Mapping | None) -> int | None:
    return 2**62  # past every end: D1 checked no end


def _pending_served(keep: ResourceItem, m: Mapping | None) -> int | None:
    if m is not None and m.state == PENDING:
        m = replace(m, state=LIVE)
    return verdicts.served_end(keep, m)


def _margin_only(margin_us: int, grace_us: int) -> int:
    return margin_us


def _own_region(keep: ResourceItem, extra: ResourceItem) -> str:
    return keep.region


def _release_as_lease(
    r: ResourceItem, now_us: int, quarantine_us: int, grace_us: int, ops: JobOps
) -> Program[Result]:
    return release_held(r, now_us, quarantine_us, grace_us, ops=ops)


@functools.cache
def job_ops(p: Protocol) -> JobOps:
    """The pure functions the jobs' programs (``rasd.steps.repair``, ``.dedupe``) use under
    rule set ``p``: the real ones, but for the one its bug replaces (one instance per rule
    set: states compare it by identity)."""
    ops = JobOps()
    if p.holder_always_current:
        ops = replace(ops, orphan_verdict=_holder_always_current)
    if p.quarantine_in_index:
        ops = replace(ops, early_free=p.early_free)
    if p.orphan_quarantine_only:
        ops = replace(ops, orphan_free_at=_quarantine_only)
    if p.dedupe_unversioned:
        ops = replace(ops, served_end=_served_forever, map_release=_map_release_unversioned)
    if p.dedupe_pending_survivor:
        ops = replace(ops, served_end=_pending_served)
    if p.dedupe_margin_only:
        ops = replace(ops, dedupe_slack=_margin_only)
    if p.dedupe_survivor_own_region:
        ops = replace(ops, survivor_seen_in=_own_region)
    if p.dedupe_orphan_as_lease:
        ops = replace(ops, release_orphan=_release_as_lease)
    return ops


@functools.cache
def ops_of(proto: Protocol) -> Ops:
    """The functions the daemons' programs (``rasd.steps.daemon``) run with under ``proto``:
    the real ones, or this rule set's (one instance per rule set: states compare it by
    identity)."""
    if proto == REAL:
        return REAL_OPS
    ops = Ops(
        name=proto.name,
        on_read=proto.on_read,
        on_resource=proto.on_resource,
        after_acquire=proto.after_acquire,
        after_extend=proto.after_extend,
        on_extend_check=proto.on_extend_check,
        after_extend_read=proto.after_extend_read,
        free_claim=proto.free_claim,
        quarantine_us=proto.quarantine_us,
        holds_to_end=proto.holds_to_end,
        given_back=proto.given_back,
        on_settle=proto.on_settle,
        beside_legacy=proto.beside_legacy,
        on_lapsed=proto.on_lapsed,
        lapsing=proto.lapsing,
    )
    return replace(ops, strict_home=_no_home) if proto.skip_agreement else ops


def _no_home(d: object, client_id: str, pool_id: str) -> None:
    return None


def _never_quarantined(r: ResourceItem, now_us: int) -> bool:
    return False


def _held_until_now(r: ResourceItem, now_us: int, quarantine_us: int, grace_us: int) -> int:
    return now_us if r.key is None else verdicts.name_held_until(r, now_us, quarantine_us, grace_us)


def _holder_alone(m: Mapping | None, r: ResourceItem) -> bool:
    return r.holder is not None and r.holder_current


@functools.cache
def admin_ops(p: Protocol) -> AdminOps:
    """What rasadmin's deletes (``rasd.steps.admin``) decide with under rule set ``p``
    (one instance per rule set: states compare it by identity)."""
    if not (p.admin_delete_quarantined or p.admin_no_hold or p.adopt_trusts_holder):
        return ADMIN_OPS
    ops = AdminOps()
    if p.adopt_trusts_holder:
        ops = replace(ops, names_claim=_holder_alone)
    if p.admin_delete_quarantined:
        ops = replace(ops, in_quarantine=_never_quarantined)
    if p.admin_no_hold:
        ops = replace(ops, name_held_until=_held_until_now)
    return ops
