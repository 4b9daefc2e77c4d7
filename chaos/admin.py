"""An operator with ``rasadmin`` on a loop while the daemons serve (:class:`Admin`), and what
its actions add up to."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fleet import tables
from rasd.core.serialize import is_tombstone, item_from_ddb

from .children import ddb_client
from .commands import Commands, Events, last_json
from .params import CLIENT, POOL, TABLE_REGION, Params


class Admin(Commands):
    """An operator with ``rasadmin`` while the daemons serve, every ``admin_every`` seconds,
    the regions in turn:

    * ``delete-resource`` (no ``--force``) of a free item of the region, picked from its
      replica: a claimable one, or every third turn one in quarantine, which rasadmin must
      refuse (a claim can also take the item between the pick and the delete: refusals are
      counted by reason);
    * every second turn, ``add-resources`` of the names deleted so far (each held by its
      tombstone until the lease or quarantine it had is over), alternately in the region
      each was deleted from and in the other one (an operator moving capacity by hand: the
      tombstone written in one replica, the name re-added in the other);
    * every fifth turn, the first included, ``add-pool``: the pool redefined with the next of
      ``max_leases``.

    Each command runs against its region's replica, as rasadmin requires."""

    def __init__(
        self,
        p: Params,
        endpoints: dict[str, str],
        env: dict[str, str],
        events: Events,
        work: Path,
    ) -> None:
        super().__init__("chaos-admin")
        self.p, self.endpoints, self.env, self.events, self.work = p, endpoints, env, events, work
        self.rng = random.Random(f"{p.seed}/admin")
        self.ddb = {
            r: ddb_client(u, r if p.replicated() else TABLE_REGION) for r, u in endpoints.items()
        }
        self.deleted: list[tuple[str, str]] = []  # (region, name), not added again yet

    def run(self) -> None:
        turn = 0
        while not self.stop_ev.wait(self.p.admin_every):
            region = self.p.regions[turn % len(self.p.regions)]
            try:
                self.delete(region, quarantined=turn % 3 == 2)
            except Exception as exc:  # noqa: BLE001 - the pick's read failed: counted
                self.record("delete", region, [], None, {"status": "pick failed: " + repr(exc)})
            if turn % 2 == 1 and self.deleted:
                self.readd(elsewhere=turn % 4 == 3)
            if turn % 5 == 0:  # from the first turn: a run that makes one turn redefines
                self.redefine(region, self.p.max_leases[(turn // 5) % len(self.p.max_leases)])
            turn += 1

    def free_items(self, region: str) -> tuple[list[str], list[str]]:
        """The region's free items, as its replica shows them now (strongly consistent):
        those claimable now, and those in quarantine."""
        now_us = time.time_ns() // 1000
        claimable: list[str] = []
        quarantined: list[str] = []
        for raw in tables.items(
            self.ddb[region],
            "query",
            TableName=self.p.table,
            KeyConditionExpression="client_id = :c",
            ExpressionAttributeValues={":c": {"S": CLIENT}},
            ConsistentRead=True,
        ):
            if is_tombstone(raw):
                continue
            it = item_from_ddb(raw)
            if it.region == region and not it.leased:
                (claimable if it.claimable(now_us) else quarantined).append(it.resource)
        return sorted(claimable), sorted(quarantined)

    def delete(self, region: str, quarantined: bool) -> None:
        """Delete a claimable item of ``region``, or (``quarantined``) one in quarantine,
        which rasadmin must refuse."""
        claimable, held = self.free_items(region)
        names = (held or claimable) if quarantined else (claimable or held)
        if not names:
            self.record("delete", region, [], None, {"status": "none free"})
            return
        name = self.rng.choice(names)
        rec = self.rasadmin(
            "delete", region, [name], ["delete-resource", "--client", CLIENT, "--resource", name]
        )
        if rec["exit"] == 0:
            self.deleted.append((region, name))

    def readd(self, elsewhere: bool) -> None:
        by_region: dict[str, list[str]] = {}
        regions = self.p.regions
        for region, name in self.deleted:
            if elsewhere:
                region = regions[(regions.index(region) + 1) % len(regions)]
            by_region.setdefault(region, []).append(name)
        self.deleted = []
        for region, names in by_region.items():
            f = self.work / f"readd-{region}.txt"
            f.write_text("".join(n + "\n" for n in names))
            args = ["add-resources", "--client", CLIENT, "--pool", POOL, "--file", str(f)]
            rec = self.rasadmin("readd_elsewhere" if elsewhere else "readd", region, names, args)
            if rec["exit"] != 0:
                self.deleted += [(region, n) for n in names]  # again next time

    def redefine(self, region: str, max_lease: float) -> None:
        args = ["add-pool", "--client", CLIENT, "--pool", POOL, "--max-lease", f"{max_lease:g}"]
        self.rasadmin("redefine", region, [], args)

    def rasadmin(
        self, action: str, region: str, names: list[str], args: list[str]
    ) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "rasd_jobs.admin", *args, "--table", self.p.table,
               "--region", region, "--endpoint-url", self.endpoints[region],
               "--log-level", "error"]  # fmt: skip
        t0 = time.time()
        done = self.call(cmd, self.env)
        if done is None:
            return {"exit": None}
        code, out, err = done
        summary = last_json(out, {"error": err.decode(errors="replace").strip()[-300:]})
        return self.record(action, region, names, code, summary, t0)

    def record(
        self,
        action: str,
        region: str,
        names: list[str],
        code: int | None,
        summary: dict[str, Any],
        t0: float | None = None,
    ) -> dict[str, Any]:
        now = time.time()
        rec = {"action": action, "region": region, "resources": names, "exit": code,
               "t0": round(t0 or now, 3), "t1": round(now, 3), **summary}  # fmt: skip
        if self.stop_ev.is_set() and code not in (0, None):
            rec["stopped"] = True
        self.events.admin.append(rec)
        return rec


#: rasadmin's refusals (its messages) -> the reason counted
REFUSALS = (
    ("cannot connect to DynamoDB", "unreachable"),  # its words name the region too
    ("in quarantine", "quarantine"),
    ("leased by key", "leased"),
    ("changed after it was read", "changed"),
    ("no resource", "gone"),
    ("region", "region"),
)


def refusal(message: str) -> str:
    """Why rasadmin refused (exit 1), from its message on stderr."""
    return next((why for text, why in REFUSALS if text in message), "other")


def admin_summary(admin: list[dict[str, Any]]) -> dict[str, Any]:
    """rasadmin's actions: what was done, what it refused (and why), what failed."""
    out: Counter[str] = Counter()
    for a in admin:
        act, code = a["action"], a.get("exit")
        if a.get("stopped") or code is None:
            out[f"{act}_stopped" if a.get("stopped") else f"{act}_skipped"] += 1
            continue
        if code == 0:
            if act == "delete":
                out["deletes"] += 1
            elif act.startswith("readd"):
                out["re_adds"] += int(a.get("added", 0))
                if act == "readd_elsewhere":
                    out["re_adds_in_the_other_region"] += int(a.get("added", 0))
                out["re_adds_held_by_tombstone"] += int(a.get("held_by_tombstone", 0))
                out["re_adds_skipped_existing"] += int(a.get("skipped_existing", 0))
            else:
                out["redefinitions"] += 1
            continue
        out[
            f"{act}_refused_{refusal(str(a.get('error', '')))}" if code == 1 else f"{act}_failed"
        ] += 1
    return dict(sorted(out.items()))


def admin_writes(admin: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """rasadmin's deletes and re-adds as evidence rows (one per resource)."""
    return [
        {"t": a["t0"], "t1": a["t1"], "res": n, "actor": "admin", "action": a["action"],
         "in": a["region"], "exit": a.get("exit")}
        for a in admin
        for n in a.get("resources", [])
    ]  # fmt: skip
