"""The acquisition's writes, in the order each mode sends them (``rasd.steps.take.acquire``
driven with scripted results: no I/O, time passed in)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rasd.config import Config
from rasd.core.decide import Outcome
from rasd.core.lease import Pool, ResourceItem
from rasd.steps import Mono, Note, Now, Send, Spawn, Together, WriteResult, drive_sync
from rasd.steps.daemon import (
    CachePut,
    DaemonContext,
    LostCandidate,
    NewToken,
    RateLimit,
    RefillSoon,
    TakeCandidate,
    Untake,
)
from rasd.steps.take import acquire

POOL = Pool("c", "p", 3600 * 10**6)
RULES = Config().validate().rules()
ITEM = ResourceItem("c", "r1", "p", "us-east-1", "c#p#us-east-1#0", 3)


@dataclass
class Cand:
    item: ResourceItem


def run(legacy: bool, mapping: Outcome, claim: Outcome = Outcome.APPLIED) -> tuple[Any, list[Any]]:
    """``acquire`` with one candidate; the mapping write answered ``mapping``, the claim
    ``claim``. Returns (the program's result, the effects it yielded)."""
    seen: list[Any] = []
    cands = [Cand(ITEM)]

    def result(send: Any) -> WriteResult:
        return WriteResult(claim if kind(send) == "claim" else mapping)

    def perform(eff: Any) -> Any:
        seen.append(eff)
        if isinstance(eff, RateLimit):
            return 0.0
        if isinstance(eff, NewToken):
            return "tok"
        if isinstance(eff, TakeCandidate):
            return cands.pop() if cands else None
        if isinstance(eff, Now):
            return 10**12
        if isinstance(eff, Mono):
            return 1.0
        if isinstance(eff, Send):
            return result(eff)
        if isinstance(eff, Together):
            return tuple(result(c) for c in eff.calls)
        if isinstance(eff, (RefillSoon, Untake, LostCandidate, Note, CachePut, Spawn)):
            return None
        raise AssertionError(eff)

    d = DaemonContext("us-east-1", "host-1", RULES, legacy_agents=legacy)
    try:
        got: Any = drive_sync(acquire(d, POOL, "k", 2 * 10**12, 0), perform)
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
        got = exc
    return got, seen


def sends(seen: list[Any]) -> list[str]:
    """The writes in the order they went out (a round trip of several: joined by +)."""
    out = []
    for e in seen:
        if isinstance(e, Send):
            out.append(kind(e))
        elif isinstance(e, Together):
            out.append("+".join(kind(c) for c in e.calls))
    return out


def kind(send: Any) -> str:
    return "claim" if send.write.key == ITEM.ident else "mapping"


def test_beside_the_paper_agent_the_claim_waits_for_the_mapping() -> None:
    got, seen = run(legacy=True, mapping=Outcome.APPLIED)
    assert sends(seen) == ["mapping", "claim"]
    assert got.resource == "r1" and got.token == "tok"  # the pending mapping, to settle


def test_a_daemon_that_loses_the_mapping_never_writes_the_item() -> None:
    """The key's mapping went to another daemon: beside the paper's agent, no claim is sent
    (the old agent would answer it from the leased index before it was given back), and the
    candidate goes back to the buffer."""
    got, seen = run(legacy=True, mapping=Outcome.REJECTED)
    assert got is None  # read again
    assert sends(seen) == ["mapping"]
    assert any(isinstance(e, Untake) for e in seen)


def test_an_unknown_mapping_write_sends_no_claim_either() -> None:
    got, seen = run(legacy=True, mapping=Outcome.UNKNOWN)
    assert sends(seen) == ["mapping"]
    assert isinstance(got, Exception)  # given up: the outcome is not known


def test_without_the_paper_agent_both_writes_share_one_round_trip() -> None:
    got, seen = run(legacy=False, mapping=Outcome.APPLIED)
    assert sends(seen) == ["mapping+claim"]
    assert got.resource == "r1"
    got, seen = run(legacy=False, mapping=Outcome.REJECTED)
    assert sends(seen) == ["mapping+claim"] and got is None  # the claim is given back
