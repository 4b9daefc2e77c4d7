"""``rasadmin``'s writes, ``rasadmin adopt``'s adoption and the balancer's move, as programs.

Theory of operation
-------------------
Every command that frees, deletes, adds or redefines something keeps I1 (docs/design.md):
nothing it frees, deletes or adds is claimable while a lease or quarantine on that resource
may still run.

* :func:`release_resource`: a held item given back the way a daemon gives it back
  (:func:`rasd.steps.repair.release_held`), held to its lease's end (no app released it).
* :func:`delete_resource` / :func:`delete_item`: a resource becomes a tombstone that holds its
  name until every lease and quarantine on it has run out (``rasd.core.verdicts.name_held_until``);
  a held one's mapping is released first, so no daemon serves a lease on a resource that is
  gone. :func:`delete_pool`: the definition, then every item, each in its region's replica.
* :func:`add_resource`: a new name, or a tombstone's name again, claimable no earlier than
  the tombstone's hold (``rasd.core.builders.readd``); :func:`define_pool`: a pool's definition.
* :func:`adopt_lease`: a running lease the paper's agent made becomes a rasd lease where it
  is, by the daemon's own adoption (``map_acquire``, ``adopt``, ``map_confirm``); a claim of
  rasd's that the key's mapping does not name (the fast rules' losing claim whose give-back
  never went out) is freed by the liberator's orphan repair instead
  (:func:`rasd.steps.repair.repair`, held to its end), since the paper's agent would answer
  it from the leased index beside the key's lease (I2). :func:`settle_pending`: a pending
  mapping whose claim may still land is fenced by the readers' rule
  (``rasd.core.decide.on_resource``).
* :func:`move_free`: the balancer's move of a free item to another region
  (``rasd.core.builders.move``, conditional on the version, free and region read).

A command's refusals (leased, in quarantine, another region's item) are decisions too: the
programs return them as :class:`AdminResult` values and the command prints them. The deletes
take their two defences of I1 (the refusal of a quarantined item without ``force``, the
tombstone's hold) from :class:`AdminOps`, which only the checker's known-bad rule sets
replace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core import decide, verdicts
from ..core import legacy as legacy_rules
from ..core.builders import adopt, fence_resource, move, new_resource_item, readd, tombstone
from ..core.lease import META_CLIENT, PENDING, Mapping, ResourceItem, fmt_time, map_pk
from ..core.map_builders import map_acquire, map_confirm, map_drop_dead, map_release
from ..core.serialize import is_tombstone, mapping_from, pool_item, resource_from
from ..core.writes import ItemKey
from . import At, Delete, GetItem, Note, Program, Put, Send, in_region
from .repair import (
    OPS,
    Ops,
    applied,
    fields,
    mapping_ident,
    read_mapping,
    read_resource,
    release_held,
)
from .repair import repair as repair_orphan

#: how often a delete or an add re-reads an item a daemon keeps writing, before it gives up
ATTEMPTS = 5


def _in_quarantine(r: ResourceItem, now_us: int) -> bool:
    return not r.claimable(now_us)


def _names_claim(m: Mapping | None, r: ResourceItem) -> bool:
    return (
        m is not None
        and m.state != "free"
        and r.holder is not None
        and r.holder_current
        and (m.token, m.resource) == (r.holder, r.resource)
    )


@dataclass(frozen=True, eq=False)
class AdminOps:
    """What the deletes decide with (the real functions by default). Compared by identity."""

    #: a free item a cache may still serve (early-freed, its quarantine running): deleted
    #: only with ``force``
    in_quarantine: Callable[[ResourceItem, int], bool] = _in_quarantine
    #: until when a deleted name stays held (a re-add is claimable no earlier)
    name_held_until: Callable[[ResourceItem, int, int, int], int] = verdicts.name_held_until
    #: does the key's mapping (read strongly consistent) name this held item's claim, so
    #: ``adopt`` leaves it as rasd's? (else a claim of rasd's is an orphan, freed)
    names_claim: Callable[[Mapping | None, ResourceItem], bool] = _names_claim


ADMIN_OPS = AdminOps()


@dataclass(frozen=True)
class AdminResult:
    """What a command's program did, or why it refused: ``status``, the item as read (when
    there was one) and a detail (a region, a time, a key)."""

    status: str
    item: ResourceItem | None = None
    detail: str | None = None


def _read_resource(ident: ItemKey) -> Program[ResourceItem | None]:
    raw = yield GetItem(ident)
    if raw is None or "pool_id" not in raw or str(raw["client_id"]).startswith("#"):
        return None
    return resource_from(raw)


def release_resource(
    ident: ItemKey, region: str, now_us: int, quarantine_us: int, grace_us: int, ops: Ops = OPS
) -> Program[AdminResult]:
    """``rasadmin release-resource``: ``missing``, ``other_region`` (detail: its region),
    ``not_leased``, ``no_holder`` (an older rasd's lease: the liberator frees it at its end),
    ``lost_race`` (a daemon wrote it after it was read), or ``released`` (detail: when it is
    claimable again). No app released it: apps may use it until its end, so it is claimable
    only after that end plus the skew, however short the quarantine (I1)."""
    it = yield from _read_resource(ident)
    if it is None:
        return AdminResult("missing")
    if it.region != region:
        return AdminResult("other_region", it, it.region)
    if not it.leased:
        return AdminResult("not_leased", it)
    if it.holder is None:
        return AdminResult("no_holder", it)
    got = yield from release_held(
        it, now_us, quarantine_us, grace_us, hold_to_end=True, ops=ops, by_operator=True
    )
    if got == "lost_race":
        return AdminResult("lost_race", it)
    after = (yield GetItem(ident)) or {}
    until = after.get("quarantine_until") or after.get("lease_available")
    return AdminResult("released", it, None if until is None else str(until))


def delete_item(
    ident: ItemKey,
    now_us: int,
    force: bool,
    quarantine_us: int,
    grace_us: int,
    ops: AdminOps = ADMIN_OPS,
) -> Program[bool]:
    """Delete a resource item; one with a running lease, or in quarantine, only with
    ``force``. The mapping of any lease on it (running or lapsed) is ended first. The item
    becomes a tombstone that holds its name until ``rasd.core.verdicts.name_held_until`` (what a
    re-add waits for). Conditional on the version read (re-read and retried a few times
    when a daemon writes it meanwhile). False: it is leased or quarantined and ``force`` was
    not given, or it kept changing."""
    for _ in range(ATTEMPTS):
        raw = yield GetItem(ident)
        if raw is None or is_tombstone(raw):
            return True
        r = resource_from(raw)
        if r.key is not None:
            if not force and not r.expired(now_us):
                return False
            if r.holder is not None:
                yield Note("lease_ended", fields(r, token=r.holder), "debug")
                applied((yield Send(map_release(mapping_ident(r), r.holder, now_us))))
        elif not force and ops.in_quarantine(r, now_us):
            return False
        hold = ops.name_held_until(r, now_us, quarantine_us, grace_us)
        if r.key is not None and r.holder is None:  # the paper's agent's: no mapping
            yield Note("lease_ended", fields(r), "debug")
        if applied((yield Send(tombstone(r, now_us, hold)))):
            return True
    return False


def delete_resource(
    ident: ItemKey,
    region: str,
    now_us: int,
    force: bool,
    quarantine_us: int,
    grace_us: int,
    ops: AdminOps = ADMIN_OPS,
) -> Program[AdminResult]:
    """``rasadmin delete-resource``: ``missing``, ``other_region``, ``leased`` (detail: its
    end) or ``quarantined`` (detail: until when) without ``force``, ``changed`` (it kept
    changing), or ``deleted`` (detail: until when its name stays held)."""
    it = yield from _read_resource(ident)
    if it is None:
        return AdminResult("missing")
    if it.region != region:
        return AdminResult("other_region", it, it.region)
    if it.leased and not it.expired(now_us) and not force:
        return AdminResult("leased", it)
    if not it.leased and ops.in_quarantine(it, now_us) and not force:
        return AdminResult("quarantined", it, it.quarantine_until or it.lease_available)
    if not (yield from delete_item(ident, now_us, force, quarantine_us, grace_us, ops)):
        return AdminResult("changed", it)
    tomb = (yield GetItem(ident)) or {}
    hold = tomb.get("hold_until")
    return AdminResult("deleted", it, None if hold is None else str(hold))


def pool_key(client_id: str, pool_id: str) -> ItemKey:
    return (META_CLIENT, f"pool#{client_id}#{pool_id}")


@dataclass(frozen=True)
class PoolDelete:
    """What ``rasadmin delete-pool`` found (its Query of the client's items) and may do."""

    client_id: str
    pool_id: str
    defined: bool
    items: tuple[ResourceItem, ...]
    now_us: int
    force: bool
    quarantine_us: int
    grace_us: int
    dry_run: bool = False


def delete_pool(p: PoolDelete) -> Program[AdminResult]:
    """``rasadmin delete-pool``: ``missing``; ``leased`` or ``quarantined`` (without
    ``force``; the item is an example); ``dry_run``; or ``deleted``: the definition first
    (daemons stop handing out the pool at their next pool refresh), then every item, each in
    its region's replica (:class:`rasd.steps.At`), only as read unless ``force``. Counts
    ``deleted`` and ``changed_meanwhile`` notes."""
    if not p.defined and not p.items:
        return AdminResult("missing")
    held = [it for it in p.items if it.leased and not it.expired(p.now_us)]
    if held and not p.force:
        return AdminResult("leased", held[0], str(len(held)))
    quarantined = [it for it in p.items if not it.leased and not it.claimable(p.now_us)]
    if quarantined and not p.force:
        return AdminResult("quarantined", quarantined[0], str(len(quarantined)))
    if p.dry_run:
        return AdminResult("dry_run")
    if p.defined:
        applied((yield Delete(pool_key(p.client_id, p.pool_id))))
    for it in p.items:
        prog = delete_item(it.ident, p.now_us, p.force, p.quarantine_us, p.grace_us)
        done = yield from in_region(it.region, prog)
        yield Note("deleted" if done else "changed_meanwhile")
        if not done:
            yield Note("changed_meanwhile", (("resource", it.resource),), "warning")
    return AdminResult("deleted")


def define_pool(
    client_id: str,
    pool_id: str,
    max_lease_s: float,
    only_new: bool = False,
    home: str | None = None,
    outage_budget_s: float = 0.0,
    quarantine_s: float = 0.0,
) -> Program[bool]:
    """``rasadmin add-pool``: define the pool, or redefine its longest lease (daemons read it
    at their next pool refresh; a lease already given keeps its end). ``home``: a strict
    pool's home region (docs/global.md, "Strict pools"); ``outage_budget_s`` and
    ``quarantine_s``: its outage budget and the quarantine of its released leases
    (docs/design.md, "An outage budget"). ``only_new`` (``rasadmin adopt``): only if it is
    not defined. True: written."""
    return applied(
        (
            yield Put(
                pool_key(client_id, pool_id),
                pool_item(client_id, pool_id, max_lease_s, home, outage_budget_s, quarantine_s),
                only_new=only_new,
            )
        )
    )


def add_resource(client_id: str, pool_id: str, region: str, name: str, now_us: int) -> Program[str]:
    """Add one name, free: ``"added"`` (claimable now), ``"held"`` (a tombstone's name:
    claimable from its ``hold_until``), ``"exists"`` (a resource took the name meanwhile:
    left alone) or ``"changing"`` (it kept changing). A new name is a PutItem conditional on
    no item under it, so a name deleted since the listing is never overwritten without its
    hold."""
    ident = (client_id, name)
    item = new_resource_item(client_id, pool_id, region, name, now_us)
    for _ in range(ATTEMPTS):
        if applied((yield Put(ident, item, only_new=True))):
            return "added"
        raw = yield GetItem(ident)
        if raw is None:
            continue  # reaped meanwhile: put again
        if not is_tombstone(raw):
            return "exists"
        hold = str(raw["hold_until"])
        w = readd(ident, int(raw["version"]), hold, pool_id, region, now_us)
        if applied((yield Send(w))):
            return "held" if hold > fmt_time(now_us) else "added"
    return "changing"


# ------------------------------------------------------------------------------ adopt
def adopt_lease(
    r: ResourceItem,
    now_us: int,
    rules: decide.Rules,
    owner: str,
    token: str,
    dry: bool,
    ops: AdminOps = ADMIN_OPS,
) -> Program[str]:
    """Adopt the running lease ``r`` (read strongly consistent) the way a daemon does, with
    the acquisition token ``token``. Returns ``rasd`` (its mapping names it already),
    ``adopted`` (or ``would_adopt``), ``kept_split`` (the key's mapping names another lease
    here: the paper's agent made this one), ``freed_orphan`` (or ``would_free_orphan``: a
    claim of rasd's beside the key's lease, :func:`free_orphan`), ``ended`` (not running any
    more) or ``lost_race`` (it changed under us: read it again)."""
    assert r.key is not None
    m = yield from read_mapping(r)
    if ops.names_claim(m, r):
        return "rasd"
    if not legacy_rules.adoptable(r, r.client_id, r.pool_id, r.key, r.region, now_us):
        return "ended"
    d = decide.on_read(m, [], now_us, rules)
    if not isinstance(d, decide.Acquire):
        if r.holder is not None and r.holder_current:
            return (yield from free_orphan(r, m, now_us, rules, dry))
        return "kept_split"
    if dry:
        return "would_adopt"
    assert r.lease_expires_us is not None
    ident = (map_pk(r.client_id, r.pool_id, r.key), r.region)
    mw = map_acquire(
        ident, d.expect_ver, token, r.resource, r.version, r.lease_expires_us, now_us, owner
    )
    if not applied((yield Send(mw))):
        return "lost_race"
    pending = Mapping(
        r.client_id,
        r.pool_id,
        r.key,
        r.region,
        d.expect_ver + 1,
        PENDING,
        token,
        r.resource,
        r.version,
        r.lease_expires_us,
        now_us,
        owner,
    )
    if not applied((yield Send(adopt(r, token, d.expect_ver + 1, now_us)))):
        # the item moved past the version read: the mapping names a claim that can never
        # land; drop it (a reader would, after pending_hold)
        applied((yield Send(map_drop_dead(pending, now_us))))
        return "lost_race"
    applied((yield Send(map_confirm(pending))))
    return "adopted"


def free_orphan(
    r: ResourceItem, m: Mapping | None, now_us: int, rules: decide.Rules, dry: bool
) -> Program[str]:
    """A running claim of rasd's (``holder`` current) held for a key whose mapping ``m`` (read
    after ``r``, strongly consistent) does not name it: what the fast rules leave when a
    losing claim's give-back never went out (a kill -9), or a crash between two writes. rasd
    never serves it, but the paper's agent answers whatever the leased index shows for the
    key, so beside the key's own lease it is a split (I2) as soon as that agent runs. Freed
    by the liberator's orphan repair (:func:`rasd.steps.repair.repair`: the mapping fenced
    first when the acquisition's write may still land; ``rasd.core.verdicts.orphan_free_at``),
    held to its lease's end plus the grace as in rollout mode (an app may have been answered
    it). Returns ``freed_orphan`` (``would_free_orphan``), ``rasd`` (a mapping names it
    after all) or ``lost_race`` (it or the mapping changed: read both again)."""
    verdict = verdicts.orphan_verdict(r, m)
    if verdict is verdicts.Orphan.LEASE:
        return "rasd"
    if verdict is verdicts.Orphan.FOREIGN:
        return "kept_split"
    if dry:
        return "would_free_orphan"
    got = yield from repair_orphan(
        r, m, now_us, rules.quarantine_us, rules.grace_us, hold_to_end=True
    )
    return {"freed_orphan": "freed_orphan", "lease": "rasd"}.get(got, "lost_race")


def settle_pending(m: Mapping, now_us: int, rules: decide.Rules, dry: bool) -> Program[str]:
    """A pending mapping (as scanned): read it again strongly consistent, then its resource
    item, and decide as every reader does (``rasd.core.decide.on_resource``). A claim that
    may still land (its acquirer gave up or died, past ``pending_hold``) is fenced: the
    resource's version moves past the one the claim is conditioned on, so it never lands
    beside a lease the paper's agent makes for the key meanwhile. Returns ``fenced``
    (``would_fence``), ``landed`` (the claim is there, named by the mapping: a lease,
    settled by its readers), ``dead`` (it can never land), ``young`` (within
    ``pending_hold``: its acquirer is still at it), ``moved`` (no longer pending) or
    ``lost_race``."""
    raw = yield GetItem(m.ident)
    cur = mapping_from(raw) if raw else None
    if cur is None or cur.state != PENDING or cur.resource is None:
        return "moved"
    r = yield from read_resource((cur.client_id, cur.resource))
    dec = decide.on_resource(cur, r, now_us, rules)
    if isinstance(dec, decide.FenceResource):
        if dry:
            return "would_fence"
        res = yield Send(fence_resource(dec.resource.ident, dec.resource.version))
        return "fenced" if applied(res) else "lost_race"
    if isinstance(dec, decide.Wait):
        return "young"
    if isinstance(dec, decide.Acquire):
        return "dead"
    return "landed"


#: a pending mapping's outcomes (:func:`settle_pending`) that leave its claim able to land:
#: the paper's agent may not start before its end
PENDING_UNSETTLED = frozenset({"young", "would_fence", "lost_race"})


@dataclass(frozen=True)
class Swept:
    """One running lease of ``rasadmin adopt``'s scan, settled (:func:`settle_lease`): the
    outcome (:func:`adopt_lease`'s, or ``ended``), the item as last read, and whether it
    may be a leftover of the fast rules the run could not settle, which the paper's agent
    may answer to its end (``unsettled``)."""

    outcome: str
    item: ResourceItem | None
    unsettled: bool


def settle_lease(
    it: ResourceItem,
    now_us: int,
    rules: decide.Rules,
    owner: str,
    tokens: tuple[str, ...],
    dry: bool,
    ops: AdminOps = ADMIN_OPS,
) -> Program[Swept]:
    """One running lease of the scan, read again strongly consistent and adopted, found
    rasd's, freed as an orphan, ... (:func:`adopt_lease`, with the next of ``tokens`` each
    time). A lost race on a claim of rasd's (a leftover being settled by someone else too)
    is read and judged again, once per token."""
    got, fresh = "lost_race", None
    for token in tokens:
        fresh = yield from read_resource(it.ident)
        if fresh is None or fresh.key != it.key:
            return Swept("ended", fresh, False)
        got = yield from adopt_lease(fresh, now_us, rules, owner, token, dry, ops)
        if got != "lost_race" or not (fresh.holder is not None and fresh.holder_current):
            break
    rasd_claim = it.holder is not None and it.holder_current
    return Swept(got, fresh, got == "would_free_orphan" or (got == "lost_race" and rasd_claim))


# ---------------------------------------------------------------------------- balancer
def move_free(item: ResourceItem, to_region: str) -> Program[bool]:
    """The balancer moves a free item (read from its region's available index) to another
    region: conditional on the version, the region and its being free, so a claim since the
    read wins (False: a lost race, normal). Made in the item's region's replica."""
    res = yield At(item.region, Send(move(item, to_region)))
    return applied(res)


__all__ = [
    "ADMIN_OPS",
    "ATTEMPTS",
    "PENDING_UNSETTLED",
    "AdminOps",
    "AdminResult",
    "PoolDelete",
    "Swept",
    "add_resource",
    "adopt_lease",
    "define_pool",
    "delete_item",
    "delete_pool",
    "delete_resource",
    "free_orphan",
    "move_free",
    "pool_key",
    "release_resource",
    "settle_lease",
    "settle_pending",
]
