"""The two rules every driver and every give-back goes through: what a read-back proves
(``map_builders.read_back``) and when a claim of ours needs the quarantine only
(``decide.given_back``)."""

from __future__ import annotations

import re
from pathlib import Path

from rasd.core import decide
from rasd.core.decide import Outcome
from rasd.core.lease import US
from rasd.core.map_builders import map_acquire, names_claim, read_back
from rasd.core.writes import Cond, Write, apply

IDENT = ("#map#c#p#k1", "us-east-1")
ACQ = map_acquire(IDENT, 1, "t-ours", "ra", 4, 3600 * US, 0, "d1")
OURS = names_claim("t-ours", "ra")


def test_a_read_back_that_shows_the_write_is_applied() -> None:
    cur = apply({"ver": 1}, ACQ)
    assert cur is not None and read_back(ACQ, cur, OURS) is True


def test_a_read_back_proves_a_refusal_only_by_the_version_it_would_have_written() -> None:
    """Another write took version 2 from 1: ours, conditioned on 1, never applied. At
    version 3 or later ours may have applied and been written over since: no proof."""
    theirs = {"ver": 2, "token": "t-theirs", "res": "rb"}
    assert read_back(ACQ, theirs, OURS) is False
    for later in (3, 7):
        assert read_back(ACQ, {**theirs, "ver": later}, OURS) is None
    assert read_back(ACQ, None, OURS) is None  # gone (reaped): no proof either
    assert read_back(ACQ, {"ver": 2, "token": "t-ours", "res": "ra"}, OURS) is True


def test_a_first_write_is_refuted_at_version_one() -> None:
    first = map_acquire(IDENT, 0, "t-ours", "ra", 4, 3600 * US, 0, "d1")
    assert read_back(first, {"ver": 1, "token": "t-theirs", "res": "rb"}, OURS) is False
    assert read_back(first, {"ver": 2, "token": "t-theirs", "res": "rb"}, OURS) is None


def test_a_write_that_bumps_no_version_is_never_refuted() -> None:
    w = Write(("c", "ra"), (Cond("holder", "=", "t-ours"),), set=(("x", 1),))
    assert read_back(w, {"holder": "t-other", "x": 2}, lambda it: it.get("x") == 1) is None


def test_a_claim_is_given_back_with_the_quarantine_only_on_proof() -> None:
    proof = decide.never_named(Outcome.REJECTED)
    assert proof is not None and decide.given_back(proof) is decide.Freed.UNNAMED
    for outcome in (Outcome.UNKNOWN, Outcome.APPLIED):
        assert decide.never_named(outcome) is None
    assert decide.given_back(None) is decide.Freed.UNRELEASED
    assert decide.holds_to_end(decide.given_back(None), False)
    assert not decide.holds_to_end(decide.given_back(proof), False)


def test_after_acquire_carries_the_proof_only_for_a_refused_mapping_write() -> None:
    step = decide.after_acquire(Outcome.REJECTED, Outcome.APPLIED, 1)
    assert isinstance(step, decide.GiveBack) and step.proof == decide.NeverNamed("map_acquire")
    assert isinstance(decide.after_acquire(Outcome.UNKNOWN, Outcome.APPLIED, 1), decide.GiveUp)


def test_only_the_rule_hands_out_the_quarantine_only_reason() -> None:
    """Every give-back of a claim goes through ``decide.given_back``: no program names the
    quarantine-only reason itself."""
    root = Path(__file__).resolve().parents[2]
    found = [
        f"{p.relative_to(root)}:{i}"
        for base in ("rasd", "jobs")
        for p in sorted((root / base).rglob("*.py"))
        if p.name != "decide.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"Freed\.UNNAMED\b", line) and "is Freed.UNNAMED" not in line
    ]
    assert found == []
