"""The simulation's two witnesses of a key answered two resources across regions (the clients'
answers, the table's audit) and the strict run's verdict on them. Records passed in: no
backends, no sleeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rasd.core.lease import fmt_time
from sim import __main__ as sim_main
from sim import strict
from sim.report import duplicates_from_audit
from sim.world import Outcome, RunResult

LEASE_S = 8.0


def _o(
    key: str,
    region: str,
    sent: float,
    done: float,
    resource: str,
    *,
    first: bool,
    new: bool = True,
    gap: float = 0.0,
    code: str = "OK",
) -> Outcome:
    """One answer of the strict pool; its lease ends ``LEASE_S`` after its send (what the
    driver asks)."""
    return Outcome(t=sent, region=region, key=key, first=first, gap=gap, code=code, new=new,
                   resource=resource, sent=sent, done=done, pool=strict.STRICT_POOL)  # fmt: skip


def _acq(res: str, key: str, t_s: float, region: str, token: str) -> dict[str, Any]:
    """An agreed claim in the stream audit (times in ms, as the replicator writes them)."""
    return {"ev": "acq", "res": res, "key": key, "t": int(t_s * 1000),
            "exp": fmt_time(int((t_s + LEASE_S) * 1_000_000)), "region": region,
            "holder": token, "pool": strict.STRICT_POOL}  # fmt: skip


def _agree(res: str, t_s: float, token: str) -> dict[str, Any]:
    return {"ev": "agree", "token": token, "res": res, "t": int(t_s * 1000)}


def _clients(outs: list[Outcome], audit: list[dict[str, Any]] | None = None) -> int:
    res = RunResult(
        params={"lease_s": LEASE_S, "lag_s": 1.0}, resources=10, initial_split={}, outcomes=outs
    )
    res.audit = audit or []
    n: int = strict.pool_report(res, strict.STRICT_POOL, strict=True)["duplicate_keys_clients"]
    return n


# ----------------------------------------------------------------------- the clients' witness
def test_a_second_answer_after_the_first_lease_ended_is_not_a_double_answer() -> None:
    """Scheduled 7.8 s after the first (within the 8 s lease) but sent 8.3 s after it, the
    driver running late under load: the first lease was over, and the strict pool answered
    the key a new lease. The table shows no overlap, and neither may the clients."""
    outs = [
        _o("k", "us-east-1", 10.0, 10.1, "r1", first=True),
        _o("k", "eu-west-1", 18.3, 18.5, "r2", first=False, gap=7.8),
    ]
    audit = [_acq("r1", "k", 10.05, "us-east-1", "t1"), _agree("r1", 10.07, "t1"),
             _acq("r2", "k", 18.4, "eu-west-1", "t2"), _agree("r2", 18.45, "t2")]  # fmt: skip
    assert duplicates_from_audit(audit, pool=strict.STRICT_POOL, strict=True)["keys"] == []
    assert _clients(outs, audit) == 0


def test_the_same_resource_answered_again_is_one_lease_whatever_its_new_flag() -> None:
    outs = [
        _o("k", "us-east-1", 10.0, 10.1, "r1", first=True),
        _o("k", "eu-west-1", 12.0, 12.2, "r1", first=False, new=True, gap=2.0),
    ]
    assert _clients(outs) == 0


def test_another_resource_answered_while_the_first_lease_runs_counts_whatever_its_flag() -> None:
    """Two resources answered while both leases run break the promise, whether the second
    answer says ``new`` or not."""
    for new in (True, False):
        outs = [
            _o("k", "us-east-1", 10.0, 10.1, "r1", first=True),
            _o("k", "eu-west-1", 12.0, 12.2, "r2", first=False, new=new, gap=2.0),
        ]
        assert _clients(outs) == 1, new


def test_an_answer_received_just_before_the_first_lease_ends_counts() -> None:
    outs = [
        _o("k", "us-east-1", 10.0, 10.1, "r1", first=True),
        _o("k", "eu-west-1", 17.7, 17.95, "r2", first=False, gap=7.7),
        # failed requests answer nothing
        _o("f", "us-east-1", 20.0, 20.1, "r3", first=True, code="TIMEOUT"),
        _o("f", "eu-west-1", 21.0, 21.1, "r4", first=False, gap=1.0),
        _o("g", "us-east-1", 30.0, 30.1, "r5", first=True),
        _o("g", "eu-west-1", 31.0, 33.0, "r6", first=False, gap=1.0, code="TIMEOUT"),
    ]
    assert _clients(outs) == 1


def test_the_clients_witness_uses_the_end_each_answer_names() -> None:
    """An answer carries its lease's end (``ends``): the first lease ended at 17.0, before
    the second answer arrived, though the lease asked was 8 s."""
    from sim.report import duplicates_from_clients

    f = _o("k", "us-east-1", 10.0, 10.1, "r1", first=True)
    s = _o("k", "eu-west-1", 17.2, 17.4, "r2", first=False, gap=7.2)
    f.ends, s.ends = 17.0, 25.2
    got = duplicates_from_clients([f, s], LEASE_S)
    assert got["keys"] == [] and [r["overlap"] for r in got["rows"]] == [False]
    f.ends = 18.0
    got = duplicates_from_clients([f, s], LEASE_S)
    assert got["keys"] == ["k"] and got["rows"][0]["resources"] == ["r1", "r2"]


# --------------------------------------------------------------------------------- the audit
def test_the_audit_keeps_an_agreed_claim_freed_before_the_end_of_the_run() -> None:
    """The audit reads every write from the streams, so a double answer stays seen when its
    claim was freed long before the run ended."""
    audit = [_acq("r1", "k", 10.0, "us-east-1", "t1"), _agree("r1", 10.05, "t1"),
             _acq("r2", "k", 12.0, "eu-west-1", "t2"), _agree("r2", 12.05, "t2"),
             {"ev": "rel", "res": "r2", "key": "k", "t": 13000}]  # fmt: skip
    assert duplicates_from_audit(audit, pool=strict.STRICT_POOL, strict=True)["keys"] == ["k"]


# ----------------------------------------------------------------------- the strict verdict
def _run(
    seed: int, valid: bool, audit: list[str], clients: list[str], probe: list[str]
) -> dict[str, Any]:
    """What ``strict.run`` returns, reduced to what the verdict and the table read."""

    def pool(name: str, is_strict: bool) -> dict[str, Any]:
        return {"pool": name, "strict": is_strict, "new_keys": 100, "second_region_requests": 10,
                "duplicate_keys": len(audit) if is_strict else 3,
                "duplicate_keys_list": audit if is_strict else [],
                "duplicate_keys_clients": len(clients) if is_strict else 3,
                "duplicate_keys_clients_list": clients if is_strict else [],
                "predicted_for_a_normal_pool": [2, 3], "claims_never_answered": 0,
                "latency_ms": {}}  # fmt: skip

    return {
        "params": {"seed": seed, "lag_s": 1.0},
        "one_way_ms": 35.0,
        "validity": {
            "valid": valid,
            "lag_p99_s": 1.2 if valid else 2.3,
            "backend_errors": 0 if valid else 27,
        },
        "pools": {"default": pool("default", False), "strict": pool("strict", True)},
        "probe": {"strict": {"keys": ["p0"], "codes": {}, "keys_answered_two_resources": probe}},
        "daemon_counters": {},
    }


@pytest.mark.parametrize(
    ("runs", "status"),
    [
        ([_run(1, True, [], [], []), _run(2, True, [], [], [])], 0),
        ([_run(1, True, [], [], []), _run(2, False, [], [], [])], 3),
        # a strict key answered twice fails the run whatever its validity, by either witness
        ([_run(1, True, [], [], []), _run(2, False, [], ["k2-1"], [])], 1),
        ([_run(1, True, [], ["k1-1"], [])], 1),
        ([_run(1, True, ["k1-1"], [], [])], 1),
        ([_run(1, False, ["k1-1"], [], [])], 1),
        ([_run(1, True, [], [], ["strict-probe-1-0"])], 1),
    ],
)
def test_the_strict_run_fails_when_either_witness_saw_a_key_answered_twice(
    runs: list[dict[str, Any]],
    status: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    canned = iter(runs)
    monkeypatch.setattr(strict, "run", lambda *a, **kw: next(canned))
    seeds = ",".join(str(r["params"]["seed"]) for r in runs)
    argv = ["--quick", "--strict", "--seeds", seeds, "--out", str(tmp_path)]
    assert sim_main.main(argv) == status
    out = capsys.readouterr().out
    if status == 1:
        assert "FAILED: the strict pool answered" in out
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert sim_main.main(["--from-json", str(next(tmp_path.glob("*.json")))]) == status
    assert (saved["strict_promise_broken"] != []) == (status == 1)


def test_the_normal_runs_report_counts_the_clients_the_same_way() -> None:
    """``make sim``'s report (``report.analyze``) uses the same witness for its pools."""
    from sim import traffic
    from sim.report import analyze

    outs = [
        _o("late", "us-east-1", 10.0, 10.1, "r1", first=True),
        _o("late", "eu-west-1", 18.3, 18.5, "r2", first=False, gap=7.8),
        _o("dup", "us-east-1", 20.0, 20.1, "r3", first=True),
        _o("dup", "eu-west-1", 20.3, 20.4, "r4", first=False, gap=0.3),
    ]
    params = {"lease_s": LEASE_S, "lag_s": 1.0, "day_s": 100.0, "balancer": True}
    res = RunResult(params=params, resources=10, initial_split={}, outcomes=outs)
    got = analyze(res, traffic.default_scenario())["duplicates"]
    assert got["duplicate_keys_driver"] == 1
    assert [d["key"] for d in got["driver_only"]] == ["dup"]
