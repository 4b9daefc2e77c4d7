"""rasadmin's commands and the balancer's move as actors of the model: the programs of
``rasd.steps.admin``, one command at a time on rasadmin's clock, stepped by
:mod:`check.effects` (docs/checker.md, "What is modeled": rasadmin and the balancer).
"""

from __future__ import annotations

from typing import Any

from rasd.core.lease import US
from rasd.steps import Spawn
from rasd.steps.admin import (
    add_resource,
    adopt_lease,
    define_pool,
    delete_resource,
    move_free,
    release_resource,
)

from .effects import start, step
from .jobs import HOST, _res_keys, _versions
from .rulesets import admin_ops, job_ops
from .world import CLIENT, POOL, Out, World, _res_of

#: the command names of the model's rasadmin processes (their labels begin with these)
KINDS = ("rasadmin", "balancer")


def _start(w0: World, sp: Spawn, label: str, offset: int) -> Out:
    """Start ``sp`` and make its first call, in one step."""
    w = w0.clone()
    cmds, moves = w.admin
    w.admin = (cmds, moves + 1) if label.startswith("balancer") else (cmds + 1, moves)
    start(w, HOST, sp.trace(), label, offset=offset)
    p = next((q for q in w.jobs if q.label == label), None)
    if p is None:  # it ended without a call
        return [(label, w)]
    return [(f"{label}: {lab[len(label) + 1 :]}", x) for lab, x in step(w, HOST, p)]


def actions(w0: World) -> Out:
    """Every command rasadmin or the balancer may start now."""
    cfg = w0.cfg
    if any(p.label.startswith(KINDS) for p in w0.jobs):
        return []
    out: Out = []
    if w0.admin[1] < cfg.balancer_moves:
        out += _moves(w0)
    if w0.admin[0] >= cfg.admin_runs:
        return out
    off = cfg.admin_offset
    now = w0.now_us(off)
    real = cfg.rules()
    for k in _res_keys(w0):
        it = _res_of(w0.table[k])
        name = k[1]
        if it is None:
            if "add" in cfg.admin:  # a deleted name, added again
                region = cfg.res_region(name)
                sp = Spawn(add_resource, (CLIENT, POOL, region, name, now))
                out += _start(w0, sp, f"rasadmin add-resources {name}", off)
            continue
        for force in (False, True):
            if ("force" if force else "delete") not in cfg.admin:
                continue
            args = (
                k,
                it.region,
                now,
                force,
                real.quarantine_us,
                real.grace_us,
                admin_ops(w0.proto),
            )
            label = f"rasadmin delete-resource {name}" + (" --force" if force else "")
            w = w0
            if force and it.key is not None:
                # the operator ends the key's lease (I2: as if its app had released it; I1
                # still holds: the name stays held to the lease's end)
                w = w0.clone()
                w.release_called(it.key)
            out += _start(w, Spawn(delete_resource, args), label, off)
        if "release" in cfg.admin and it.key is not None:
            # the operator ends the key's lease (I2: as if its app had released it); apps
            # may still use it to its end (I1)
            w = w0.clone()
            w.release_called(it.key)
            rel = (k, it.region, now, real.quarantine_us, real.grace_us, job_ops(w0.proto))
            out += _start(w, Spawn(release_resource, rel), f"rasadmin release-resource {name}", off)
        if (
            "adopt" in cfg.admin
            and it.key is not None
            and it.lease_expires_us is not None
            and it.lease_expires_us > now
        ):
            w = w0.clone()
            token = w.new_token()
            sp = Spawn(adopt_lease, (it, now, w0.rules, "rasadmin-adopt", token, False))
            out += _start(w, sp, f"rasadmin adopt {name}", off)
    if "pool" in cfg.admin:
        for s in cfg.pool_leases:
            if w0.pool().max_lease_us == s * US:
                continue
            sp = Spawn(define_pool, (CLIENT, POOL, float(s)))
            out += _start(w0, sp, f"rasadmin add-pool --max-lease {s}", off)
    return out


def _moves(w0: World) -> Out:
    """The balancer moves one free item of another region to its own: any the donor
    region's lagging available index shows (``jobs/rasd_jobs/balancer.py`` ``candidates``)."""
    cfg = w0.cfg
    out: Out = []
    seen: set[Any] = set()
    for k in _res_keys(w0):
        for it in _versions(w0, k):
            if (
                it.key is not None
                or it.lease_available is None
                or it.region == cfg.balancer_region
                or (it.resource, it.version) in seen
            ):
                continue
            seen.add((it.resource, it.version))
            sp = Spawn(move_free, (it, cfg.balancer_region))
            label = f"balancer move {it.resource}@v{it.version} {it.region}->{cfg.balancer_region}"
            out += _start(w0, sp, label, cfg.admin_offset)
    return out


__all__ = ["KINDS", "actions"]
