"""The chaos run's end of the rollout (``python -m chaos --mixed --end-rollout-at``), its pure
parts: what one ``rasadmin end-rollout`` attempt records, when the run counts the end as done,
and the parameters it refuses. The run itself is tests/integration/test_chaos.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaos import paper
from chaos.cli import params
from chaos.end_rollout import end_rollout_attempt, end_rollout_result
from chaos.params import Params
from rasd.core.rollout import Rollout


def summary(**kw: Any) -> bytes:
    return (json.dumps({"job": "end-rollout", **kw}) + "\n").encode()


def test_a_refusal_records_the_paper_leases_it_found() -> None:
    items = [{"resource": "us-0001", "key": "key-007", "running": True}]
    found = {"scanned": 90, "running": 1, "ended": 2, "items": items}
    rec = end_rollout_attempt(1, summary(paper_leases=found, refused="1 running and 2 ..."), b"")
    assert rec == {"exit": 1, "reason": "paper_leases", "running": 1, "ended": 2, "items": items}


def test_other_refusals_and_errors_say_why() -> None:
    found = {"scanned": 90, "running": 0, "ended": 0, "items": []}
    changed = end_rollout_attempt(1, summary(paper_leases=found, refused="changed"), b"")
    assert changed["reason"] == "record_changed" and changed["message"] == "changed"
    err = end_rollout_attempt(1, b"", b"rasadmin: error: DynamoDB unreachable\n")
    assert err == {"exit": 1, "reason": "error", "message": "rasadmin: error: DynamoDB unreachable"}
    assert end_rollout_attempt(0, summary(changed=True, rollout=False), b"") == {
        "exit": 0,
        "changed": True,
    }


def out(succeeded: float | None) -> dict[str, Any]:
    attempts = [{"s": 20.0, "exit": 1, "reason": "paper_leases"}]
    if succeeded is not None:
        attempts.append({"s": succeeded, "exit": 0, "changed": True})
    return {"at_s": 15.0, "attempts": attempts, "succeeded_s": succeeded}


def test_the_end_is_done_once_end_rollout_succeeded_and_stayed_off() -> None:
    p = Params(duration=50.0, mixed=True, end_rollout_at=15.0)
    off = Rollout(paper_agents=False, version=2, by="rasadmin:h", why="end-rollout")
    modes = {0: False, 1: False, 2: None}
    done = end_rollout_result(p, out(30.0), 0.0, [], off, modes)
    assert done["ok"] and done["within_traffic"] and done["refusals"] == 1
    assert done["daemons_at_end"] == {"off": 2, "on": 0, "no_answer": 1}
    assert done["record_at_end"]["paper_agents"] is False
    assert not end_rollout_result(p, out(None), 0.0, [], off, modes)["ok"]  # never succeeded
    late = end_rollout_result(p, out(51.0), 0.0, [], off, modes)  # after the traffic
    assert late["ok"] and not late["within_traffic"]
    on = Rollout(paper_agents=True, version=3)  # something turned it on again
    assert not end_rollout_result(p, out(30.0), 0.0, [], on, modes)["ok"]


class Proxy:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events


def test_a_paper_claim_that_applied_after_the_end_fails_the_run() -> None:
    p = Params(duration=50.0, mixed=True, end_rollout_at=15.0)
    off = Rollout(paper_agents=False, version=2)
    early = Proxy([{"kind": "claim", "got": 1000.0 + 16.0, "end": 1000.0 + 21.0}])
    done = end_rollout_result(p, out(30.0), 1000.0, [early], off, {})
    assert done["ok"] and done["paper_last_claim_s"] == 16.0
    assert done["paper_last_lease_end_s"] == 21.0
    late = Proxy([{"kind": "claim", "got": 1000.0 + 31.0, "end": 1000.0 + 36.0}])
    done = end_rollout_result(p, out(30.0), 1000.0, [late], off, {})
    assert done["paper_claim_after_end"] and not done["ok"]


def test_the_end_of_the_rollout_needs_a_mixed_fleet_and_a_time_within_the_traffic() -> None:
    Params(mixed=True, end_rollout_at=10.0, duration=20.0).check()
    with pytest.raises(ValueError, match="mixed"):
        Params(end_rollout_at=10.0, duration=20.0).check()
    with pytest.raises(ValueError, match="within"):
        Params(mixed=True, end_rollout_at=20.0, duration=20.0).check()
    with pytest.raises(SystemExit):
        params(["--end-rollout-at", "10"])  # refused before anything starts
    with pytest.raises(SystemExit):
        params(["--mixed", "--duration", "60", "--end-rollout-at", "60"])


def test_the_option_sets_a_short_pool_refresh_and_its_own_label() -> None:
    p = params(["--mixed", "--duration", "600", "--end-rollout-at", "300"])
    assert p.end_rollout_at == 300.0 and p.pool_refresh == 5.0
    assert p.label == "mixed-endroll-full" and p.paper_max_lease is None
    p = params(["--mixed", "--duration", "60", "--end-rollout-at", "20", "--pool-refresh", "2"])
    assert p.pool_refresh == 2.0 and p.label == "mixed-endroll-short"
    assert params(["--mixed"]).pool_refresh is None  # the daemons' default


def test_the_paper_workers_ask_for_leases_up_to_their_longest() -> None:
    assert paper.asked(None) == (3.0, 5.0, 10.0, 20.0, 40.0, 60.0)
    assert paper.asked(5.0) == (3.0, 5.0)
    assert paper.asked(1.0) == (3.0,)  # at least the shortest
