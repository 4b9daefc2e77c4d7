"""The swarm (``check.swarm``, docs/checker.md "The swarm"): CI's budget of it. Its runs are
seeds, so each test runs the same worlds and walks every time: it cannot pass or fail by
chance. The real rules break nothing in them; a known-bad rule set whose break the swarm
reaches in them is found, without a search written for it."""

from __future__ import annotations

import random

import pytest

from check import swarm
from check.explore import format_trace
from check.rulesets import PROTOCOLS, REAL
from check.world import FAULTS

pytestmark = pytest.mark.search

#: CI's runs of the real rules (about 15 s on a quiet core; `make swarm` runs an hour)
REAL_RUNS = range(0, 1000)


def test_the_real_rules_hold_in_every_world_the_swarm_draws() -> None:
    cov, found = swarm.swarm(REAL_RUNS, REAL, steps=160, shrink_s=30.0)
    assert found is None, format_trace(found.shrunk) if found else ""
    assert cov.runs == len(REAL_RUNS)
    # every actor and every fault took part in some run
    for actor in ("daemon get_lease", "rasadmin release-resource", "dedupe", "balancer",
                  "paper agent", "rollout switch", "adopt sweep", "crash",
                  "liberator", "outage window", "hit table"):  # fmt: skip
        assert cov.actors[actor] > 0, actor
    kinds = {k for k, _ in cov.faults}
    assert {"unsent", "in_flight", "reply_lost", "read_back_later", "read_failed"} <= kinds


#: known-bad sets the swarm's mix finds, each with a seed range that reaches it (the run
#: that found it is the range's last: found again, the same seed)
MIX_FINDS = [
    ("B-trust-own-claim", range(0, 200)),
    ("C-no-quarantine", range(0, 1000)),
    ("G-agreement-skipped", range(0, 200)),
    ("M-balancer-no-peers", range(0, 1000)),
]


@pytest.mark.parametrize(("rules", "seeds"), MIX_FINDS)
def test_the_swarm_finds_a_known_bad_rule_set(rules: str, seeds: range) -> None:
    cov, found = swarm.swarm(seeds, PROTOCOLS[rules], steps=160, shrink_s=20.0)
    assert found is not None, f"{rules} not found in {cov.runs} runs"
    assert found.shrunk.violation is not None
    assert len(found.shrunk.trace) <= len(found.walk.trace)


@pytest.mark.parametrize(
    ("world", "rules", "seeds"),
    [
        # a lost reply's read-back taken as a refusal (T1), the three-actor race of
        # tests/integration/test_lost_reply_races.py
        ("release-vs-lost-reply", "T1-readback-absent-rejects", range(0, 400)),
        # a strict pool's withdrawn claim freed with the quarantine only (T2)
        ("strict-fallback", "T2-give-back-unproven", range(0, 1500)),
        # adopt's sweep taking a losing claim of the fast rules for rasd's lease (T3)
        ("fast-leftover-then-adopt", "T3-adopt-trusts-holder", range(0, 400)),
        # end-rollout without waiting out the leases the paper's agent may have answered
        ("adopt-then-end-rollout", "W-end-rollout-undrained", range(0, 400)),
    ],
)
def test_the_small_worlds_find_the_roots_they_were_drawn_for(
    world: str, rules: str, seeds: range
) -> None:
    """Each root is found by walks of a small world (its actors and one kind of fault), no
    step of the race written down; the real rules pass 200 walks of the same world."""
    cfg = swarm.WORLDS[world]
    bad = next((s for s in seeds if swarm.walk_in(cfg, PROTOCOLS[rules], s, 120).violation), None)
    assert bad is not None, f"{rules} not found in {world} within {len(seeds)} walks"
    for s in range(seeds.start, seeds.start + 200):
        res = swarm.walk_in(cfg, REAL, s, 120)
        assert res.violation is None, format_trace(res)


def test_a_seed_replays_its_world_and_walk() -> None:
    a = swarm.run_one(12, REAL)
    b = swarm.run_one(12, REAL)
    assert a[0] == b[0] and [lab for lab, _ in a[1].trace] == [lab for lab, _ in b[1].trace]


def test_the_draw_reaches_every_actor_and_fault() -> None:
    rng = random.Random(0)
    cfgs = [swarm.draw(rng) for _ in range(400)]
    assert set().union(*(c.faults for c in cfgs)) == set(FAULTS)
    assert any(c.strict_home and c.home_down == "local" for c in cfgs)
    assert any(c.strict_home and c.home_down == "fail" for c in cfgs)
    assert any(c.rollout_switch and c.legacy_agents for c in cfgs)
    assert any(c.rollout_switch and not c.legacy_agents for c in cfgs)
    assert any(c.paper_calls and c.paper_liberator for c in cfgs)
    assert {c.extend_read_first for c in cfgs} == {True, False}
    # the paper's agent after adopt from the fast rules, on an index caught up
    assert any(c.paper_calls and c.rollout_switch and not c.legacy_agents for c in cfgs)
    assert all(c.history == 0 for c in cfgs if c.paper_calls and not c.legacy_agents)
    assert any(c.balancer_moves and c.dedupe_runs and c.repair_runs for c in cfgs)
    assert set().union(*(c.admin for c in cfgs)) == set(swarm.ADMIN)
    # a strict pool never beside the paper's agent, adopt only in rollout mode
    assert not any(c.strict_home and (c.legacy_agents or c.rollout_switch) for c in cfgs)
    assert not any("adopt" in c.admin and not c.legacy_agents for c in cfgs)
    # a pool with an outage budget, never a strict one (add-pool refuses it)
    assert any(c.budget for c in cfgs)
    assert not any(c.budget and c.strict_home for c in cfgs)


def test_a_stale_holder_is_not_the_claim_a_mapping_names() -> None:
    """Seed 64,906 of the hour-long swarm: the paper's liberator freed rc at the end of k2's
    lease and the paper's agent leased it to kp, leaving k2's token as a stale holder; the
    state invariant M<=R took that item for k2's claim. A holder counts only while current."""
    _, res = swarm.run_one(64906, REAL)
    assert res.violation is None, format_trace(res)
