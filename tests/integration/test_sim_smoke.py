"""The global simulation, tiny: structure and kinds of outcome, not figures.

Three moto servers, the replicator, one real daemon per region, the liberator and the balancer;
a pair of 20-second days on lopsided traffic (one region asks for almost everything, the pool
is split equally): with the balancer, then with the static split. Checks the balancer run's
report (fields, replication happened and converged, the jobs ran, ras-dedupe leaves only the
duplicates it keeps on purpose, each explained, no leased item was ever moved); that no
NO_CAPACITY was answered in either run while its region held an item claimable all along
(``sim.capacity``); and, when both runs were valid, that the balancer beats the static split.

Validity is the one time bound here, and it bounds the harness, not rasd: a run whose
replicator fell behind (p99 past 1.5x the lag) or whose backends failed 1 % of requests
measured an overloaded machine, and every global figure would be wrong (docs/global.md). So
the one figure compared here (the balancer's NO_CAPACITY against the static split's) is
asserted only when both runs were valid; everything else holds in any run (the flake hunt's
load makes some runs invalid: their report must say why)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sim import report, traffic
from sim.__main__ import PRESETS, run_pair
from sim.world import Params

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(180)]


def check_structure(
    bal: dict[str, Any], scn: traffic.Scenario, info: dict[str, Any], lag_s: float
) -> None:
    """The balancer run's report: fields, replication, jobs, dedupe, moves."""
    # the report's fields
    for field in (
        "regions",
        "requests",
        "no_capacity",
        "balancer",
        "duplicates",
        "end",
        "timeline",
        "replicator",
        "leased_items_moved",
    ):
        assert field in bal
    assert set(bal["regions"]) == set(scn.names)
    assert bal["requests"] == sum(v["requests"] for v in bal["regions"].values())
    assert bal["requests"] >= info["new_keys"]
    tl = bal["timeline"]
    assert len(tl["sim_hour"]) == len(tl["demand_keys_per_s"]["us-east-1"])

    # replication happened, without errors, and the replicas converged
    rep = bal["replicator"]
    assert rep["applied"] > 0 and rep["errors"] == 0
    assert rep["echoes_skipped"] == rep["applied"]  # every replicated write recognised
    assert bal["end"]["converged_before_dedupe"] is True
    assert bal["end"]["converged_after_dedupe"] is True

    # the jobs ran
    assert bal["balancer"]["runs"] >= 1 and bal["balancer"]["errors"] == []
    assert bal["liberator"]["runs"] >= 1 and bal["liberator"]["errors"] == 0

    # ras-dedupe ran once and left only extras kept on purpose, each explained (the survivor
    # does not outlast it: releasing it would make its region acquire a third)
    assert bal["end"]["dedupe"]["exit"] == 0
    left = bal["end"]["left_explained"]
    assert all(r["explained"] for r in left), left

    # no leased item was ever moved (stream audit and replicator)
    assert bal["leased_items_moved"] == 0
    assert rep["leased_moves"] == 0

    v = report.verdicts(bal, None, lag_s)
    assert v["no_leased_item_moved"]["met"] and v["one_dedupe_leaves_only_explained"]["met"]
    assert report.table(bal, None)


def lopsided() -> traffic.Scenario:
    """Flat demand, nearly all of it in us-east-1: the equal split leaves it a third of the
    pool for most of the need, and nothing else moves."""
    return traffic.Scenario(
        regions=(
            traffic.RegionProfile("us-east-1", 1.0, 12.0, night=1.0),
            traffic.RegionProfile("eu-west-1", 0.05, 12.0, night=1.0),
            traffic.RegionProfile("us-west-2", 0.05, 12.0, night=1.0),
        )
    )


def test_tiny_simulation_pair() -> None:
    """One pair of runs (balancer, then the static split) on lopsided traffic."""
    scn = lopsided()
    params = replace(
        Params(seed=3, lag_s=1.0, **PRESETS["tiny"]),
        day_s=20.0,
        lease_s=3.0,
        keys_per_s=4.0,
    )
    bal, static, info = run_pair(params, scn, static=True, log=lambda _msg: None)
    assert static is not None
    # whether each run measured the protocol, not an overloaded machine (replication within
    # 1.5x its lag at p99, under 1 % of requests failed for another reason than capacity),
    # and a run that did not says why; only figures depend on it, and only they are skipped
    for run in (bal, static):
        v = run["validity"]
        assert v["valid"] == (not v["why"]), v
    valid = bal["validity"]["valid"] and static["validity"]["valid"]
    print("validity", bal["validity"], static["validity"])
    assert info["new_keys"] > 0 and info["resources"] > 0
    check_structure(bal, scn, info, params.lag_s)

    # NO_CAPACITY only where the region had nothing claimable, in both runs
    assert bal["no_capacity_while_claimable"] == 0, bal["end"]
    assert static["no_capacity_while_claimable"] == 0, static["end"]
    # the static split starves us-east-1; the balancer moves the idle regions' items there
    assert bal["balancer"]["moved"] > 0 and static["balancer"]["runs"] == 0
    assert static["no_capacity"] > 0
    if valid:  # a figure: an overloaded run's proves nothing either way
        assert bal["no_capacity"] * 2 <= static["no_capacity"], (bal["regions"], static["regions"])
