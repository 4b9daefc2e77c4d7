"""bench.storetrace's analysis: which calls belong to a request, and its round trips. Pure."""

from __future__ import annotations

from typing import Any

from bench.storetrace import per_request, round_trips, summarize


def _c(what: str, t0: float, t1: float, **kw: Any) -> dict[str, Any]:
    return {"op": "X", "what": what, "t0": t0, "t1": t1, "req": "get_lease", **kw}


def test_round_trips_are_groups_of_overlapping_calls() -> None:
    assert round_trips([]) == 0
    q = _c("mappings", 0.0, 1.0)
    a, b = _c("map_acquire", 1.1, 2.0), _c("claim", 1.1, 2.2)
    assert round_trips([q]) == 1
    assert round_trips([b, q, a]) == 2  # sent together: one round trip
    assert round_trips([q, a, _c("GetItem", 2.5, 3.0)]) == 3


def test_per_request_keeps_background_work_apart() -> None:
    trace = [
        _c("refill-before", -1.0, 0.5, bg="refill"),  # started before the window: not ours
        _c("mappings", 0.1, 1.0),
        _c("map_acquire", 1.1, 2.0),
        _c("claim", 1.1, 2.0),
        _c("available", 1.1, 2.0, bg="refill"),
        _c("map_confirm", 2.05, 3.0, bg="spawn"),
        {"op": "Query", "what": "meta", "t0": 1.5, "t1": 1.6},  # the daemon's own loop
    ]
    (r,) = per_request(trace, [(0.0, 2.1)])
    assert r["round_trips"] == 2 and r["calls"] == 3
    assert sorted(r["background"]) == ["Query:meta", "X:available", "X:map_confirm"]
    s = summarize([r])
    assert s["round_trips_per_request"] == 2 and s["background_calls_per_request"] == 3
